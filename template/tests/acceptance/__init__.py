"""The acceptance tests: real worker processes, Redis, databases and Prometheus
(template-owned). A package so that its conftest and the suite's own are two modules.
"""
