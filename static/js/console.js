// The console's few behaviours, in plain JavaScript (no framework). Nothing in the pages is
// inline (no <script> blocks, no on*= handlers): the Content-Security-Policy (anex/csp.py)
// runs only this file, which binds to data- attributes.
// - [data-poll]: refresh a page's live part until nothing on it moves (X-Console-Live: 0);
// - [data-copy]: a copy-to-clipboard button;
// - [data-select-on-focus]: a read-only secret selects itself when focused;
// - #job-form: read the file's endpoint to filter the model dropdown, show the fields the
//   picked model takes, upload the file straight to storage with a progress bar, submit.
(function () {
  "use strict";

  function csrfToken(form) {
    var field = form.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  // Live parts ------------------------------------------------------------------------
  function poll(element) {
    var url = element.getAttribute("data-poll");
    var every = parseInt(element.getAttribute("data-poll-ms") || "2000", 10);
    function tick() {
      fetch(url, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
        .then(function (response) {
          if (!response.ok) { throw new Error(String(response.status)); }
          var live = response.headers.get("X-Console-Live") === "1";
          return response.text().then(function (html) {
            // Keep the keyboard focus where it was when the part is replaced.
            var focusedId = document.activeElement && document.activeElement.id;
            element.innerHTML = html;
            if (focusedId && document.getElementById(focusedId)) {
              document.getElementById(focusedId).focus();
            }
            if (live) { window.setTimeout(tick, every); }
          });
        })
        .catch(function () { window.setTimeout(tick, every * 3); });
    }
    window.setTimeout(tick, every);
  }
  document.querySelectorAll("[data-poll]").forEach(poll);

  document.querySelectorAll("[data-select-on-focus]").forEach(function (field) {
    field.addEventListener("focus", function () { field.select(); });
  });

  document.querySelectorAll("[data-copy]").forEach(function (button) {
    button.hidden = false;
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-copy"));
      var text = source.value || source.textContent;
      var done = function () {
        button.textContent = "Copied";
        window.setTimeout(function () { button.textContent = "Copy"; }, 2000);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { source.select && source.select(); });
      } else if (source.select) {
        source.select();
        document.execCommand("copy");
        done();
      }
    });
  });

  // New job ---------------------------------------------------------------------------
  var form = document.getElementById("job-form");
  if (!form) { return; }
  var fileInput = document.getElementById("file");
  var modelSelect = document.getElementById("id_model");
  var effortSelect = document.getElementById("id_reasoning_effort");
  var endpointHelp = document.getElementById("file-endpoint");
  var modelHelp = document.getElementById("model-help");
  var mediaHelp = document.getElementById("model-media");
  var inputId = form.querySelector("input[name=input_id]");
  var ENDPOINT_TASKS = {"/v1/chat/completions": "chat", "/v1/embeddings": "embed",
                        "/v1/systemone": "decide"};
  var TASK_WORDS = {chat: "chat models", embed: "embedding models", decide: "the decision model"};
  var fileTask = null;

  function show(element, visible) {
    element.hidden = !visible;
    element.querySelectorAll("input, select, textarea").forEach(function (field) {
      field.disabled = !visible;
    });
  }

  function modelChanged() {
    var option = modelSelect.selectedOptions[0];
    if (!option) { return; }
    var task = option.getAttribute("data-task");
    var efforts = (option.getAttribute("data-effort") || "").split(" ").filter(Boolean);
    var fpsMax = option.getAttribute("data-fps-max");
    var dimMin = option.getAttribute("data-dim-min");
    form.querySelectorAll("[data-task-only]").forEach(function (element) {
      show(element, element.getAttribute("data-task-only") === task);
    });
    var needs = {
      reasoning: option.hasAttribute("data-reasoning"),
      effort: efforts.length > 0,
      fps: Boolean(fpsMax),
      dimensions: Boolean(dimMin)
    };
    form.querySelectorAll("[data-needs]").forEach(function (element) {
      show(element, needs[element.getAttribute("data-needs")]);
    });
    var chosen = effortSelect.value;
    effortSelect.querySelectorAll("option[value]:not([value=''])").forEach(function (o) { o.remove(); });
    efforts.forEach(function (level) {
      var o = document.createElement("option");
      o.value = level;
      o.textContent = level + (level === option.getAttribute("data-default-effort") ? " (default)" : "");
      if (level === chosen) { o.selected = true; }
      effortSelect.appendChild(o);
    });
    var media = option.getAttribute("data-media");
    mediaHelp.textContent = task === "decide" ? "" :
      media ? "Takes " + media + " content parts beside text." : "Takes text only.";
    if (fpsMax) {
      document.getElementById("fps-help").textContent = "Up to " + fpsMax + " frames per second; leave empty for the model's default.";
    }
    if (dimMin) {
      document.getElementById("dim-help").textContent = "From " + dimMin + " to " + option.getAttribute("data-dim-max") + "; leave empty for the full width.";
    }
  }

  function filterModels(task) {
    fileTask = task;
    var firstFit = null;
    Array.prototype.forEach.call(modelSelect.options, function (option) {
      var fits = !task || option.getAttribute("data-task") === task;
      option.hidden = !fits;
      option.disabled = !fits;
      if (fits && !firstFit) { firstFit = option; }
    });
    if (modelSelect.selectedOptions[0] && modelSelect.selectedOptions[0].disabled && firstFit) {
      firstFit.selected = true;
    }
    modelHelp.textContent = task ? "Showing " + TASK_WORDS[task] + ", the ones that take this file's rows." : "";
    modelChanged();
  }

  fileInput.addEventListener("change", function () {
    var file = fileInput.files[0];
    inputId.value = "";
    endpointHelp.textContent = "";
    endpointHelp.classList.remove("errors");
    if (!file) { filterModels(null); return; }
    if (/\.parquet$/i.test(file.name)) {
      endpointHelp.textContent = "A parquet file: pick the model its rows are for.";
      filterModels(null);
      return;
    }
    file.slice(0, 1024 * 1024).text().then(function (head) {
      var line = head.replace(/^\uFEFF/, "").split("\n").find(function (l) { return l.trim(); });
      var url = null;
      try { url = JSON.parse(line).url; } catch (error) { url = null; }
      var task = ENDPOINT_TASKS[url];
      if (task) {
        endpointHelp.textContent = "Its rows call " + url + ".";
        filterModels(task);
      } else {
        endpointHelp.textContent = "The first line does not read as a request with a url we serve (/v1/chat/completions, /v1/embeddings or /v1/systemone): the job would fail its checks.";
        endpointHelp.classList.add("errors");
        filterModels(null);
      }
    });
  });
  modelSelect.addEventListener("change", modelChanged);
  modelChanged();

  var uploadBox = document.getElementById("upload-status");
  var uploadBar = document.getElementById("upload-progress");
  var uploadText = document.getElementById("upload-text");
  var submitButton = document.getElementById("submit-job");

  function uploadFailed(message) {
    uploadText.textContent = message;
    uploadText.classList.add("errors");
    submitButton.disabled = false;
  }

  form.addEventListener("submit", function (event) {
    var file = fileInput.files[0];
    if (!file && inputId.value) { return; }  // already uploaded: submit the fields
    event.preventDefault();
    if (!file) { uploadFailed("Pick a file first."); uploadBox.hidden = false; fileInput.focus(); return; }
    submitButton.disabled = true;
    uploadBox.hidden = false;
    uploadText.classList.remove("errors");
    uploadText.textContent = "Preparing the upload…";
    var body = new FormData();
    body.append("format", /\.parquet$/i.test(file.name) ? "parquet" : "jsonl");
    // The organization the page was rendered for (refused if the tab is stale).
    body.append("form_organization", form.querySelector("input[name=form_organization]").value);
    fetch(form.getAttribute("data-upload-url"), {
      method: "POST", body: body, credentials: "same-origin",
      headers: {"X-CSRFToken": csrfToken(form)}
    }).then(function (response) {
      return response.json().catch(function () {
        throw new Error("The upload could not start: reload the page and try again.");
      }).then(function (data) {
        if (!response.ok) { throw new Error(data.detail || "The upload could not start."); }
        return data;
      });
    }).then(function (target) {
      var upload = new FormData();
      Object.keys(target.fields).forEach(function (name) { upload.append(name, target.fields[name]); });
      upload.append("file", file);  // last, as the storage expects
      var xhr = new XMLHttpRequest();
      xhr.open("POST", target.upload_url);
      xhr.upload.addEventListener("progress", function (e) {
        if (e.lengthComputable) {
          uploadBar.value = Math.round(100 * e.loaded / e.total);
          uploadText.textContent = "Uploading " + file.name + ": " + uploadBar.value + "%";
        }
      });
      xhr.addEventListener("load", function () {
        if (xhr.status >= 200 && xhr.status < 300) {
          uploadBar.value = 100;
          uploadText.textContent = "Uploaded " + file.name + ". Submitting…";
          inputId.value = target.id;
          fileInput.disabled = true;  // the file went to storage; the form carries its id
          form.submit();
        } else {
          uploadFailed("The upload was refused (" + xhr.status + "): " + (xhr.responseText || "").slice(0, 300));
        }
      });
      xhr.addEventListener("error", function () { uploadFailed("The upload failed: check your connection and try again."); });
      xhr.send(upload);
    }).catch(function (error) { uploadFailed(error.message); });
  });
})();
