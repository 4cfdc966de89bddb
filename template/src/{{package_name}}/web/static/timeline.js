// The job page's timeline, live (template-owned: copier-agent-worker). Follows the job's
// events (Server-Sent Events from /jobs/ID/events, which resume after Last-Event-ID by
// themselves) and adds each as a row. Text only: event data never becomes markup.
(function () {
  "use strict";

  function when(iso) {
    return iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z");
  }

  function follow() {
    var table = document.getElementById("timeline");
    if (!table || table.dataset.live !== "yes" || !window.EventSource) {
      return;
    }
    var rows = table.tBodies[0];
    var status = document.getElementById("timeline-status");
    var url = table.dataset.stream + "?after=" + encodeURIComponent(table.dataset.after);
    var source = new EventSource(url);
    source.onmessage = function (message) {
      var event = JSON.parse(message.data);
      if (event.end !== undefined) {
        source.close();
        status.textContent = "the job is now " + event.end + "; reload the page for its outcome";
        table.dataset.live = "no";
        return;
      }
      var row = rows.insertRow(-1);
      row.className = "event event-" + event.kind;
      [
        String(event.seq),
        when(event.at),
        event.attempt === null ? "" : String(event.attempt),
        event.kind,
        event.data === null ? "" : JSON.stringify(event.data),
      ].forEach(function (text) {
        row.insertCell(-1).textContent = text;
      });
      table.dataset.after = String(event.seq);
    };
  }

  document.addEventListener("DOMContentLoaded", follow);
})();
