// The control room: a page over the HTTP API, acting with the token the person signs in with.
// No build step and nothing from elsewhere; the token stays in this tab (sessionStorage).
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("contextos.token") || "";
let following = null; // the AbortController of the run stream in view
let refreshing = null;

function say(text, ok = false) {
  const alert = $("alert");
  alert.textContent = text;
  alert.className = ok ? "ok" : "";
  alert.hidden = !text;
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token}`, ...(options.headers || {}) };
  if (options.body) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = body.error || {};
    const failure = new Error(error.message || `${response.status} ${response.statusText}`);
    failure.status = response.status;
    failure.hint = error.hint || "";
    throw failure;
  }
  return body;
}

function show(section) {
  for (const id of ["sign-in", "runs", "inbox", "run"]) $(id).hidden = id !== section;
  $("nav").hidden = section === "sign-in";
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

// -- signing in --------------------------------------------------------------------------------

async function signIn(candidate) {
  token = candidate;
  try {
    const me = await api("/v1/me");
    sessionStorage.setItem("contextos.token", token);
    const roles = me.roles.length ? ` (${me.roles.join(", ")})` : "";
    $("who").textContent = `${me.user} @ ${me.tenant}${roles}`;
    say("");
    return true;
  } catch (error) {
    token = "";
    sessionStorage.removeItem("contextos.token");
    say(`${error.message}. ${error.hint}`);
    return false;
  }
}

// -- the runs list -----------------------------------------------------------------------------

async function showRuns() {
  show("runs");
  const status = $("status-filter").value;
  const query = status ? `?status=${encodeURIComponent(status)}` : "";
  const { runs } = await api(`/v1/runs${query}`);
  const rows = $("run-rows");
  rows.replaceChildren(
    ...runs.map((run) => {
      const tr = document.createElement("tr");
      const link = document.createElement("a");
      link.href = `#/runs/${encodeURIComponent(run.run_id)}`;
      link.textContent = run.run_id;
      const cells = [link, run.agent_name, run.status, String(run.turns), when(run.updated_at)];
      for (const value of cells) {
        const td = document.createElement("td");
        td.append(value);
        tr.append(td);
      }
      tr.children[2].className = `status-${run.status}`;
      return tr;
    }),
  );
  $("no-runs").hidden = runs.length > 0;
}

// -- interrupts --------------------------------------------------------------------------------

function card(interrupt, after) {
  const node = $("interrupt-card").content.firstElementChild.cloneNode(true);
  const action = interrupt.action || {};
  node.dataset.interrupt = interrupt.interrupt_id;
  node.querySelector(".prompt").textContent = interrupt.prompt;
  const link = node.querySelector(".run-link");
  link.href = `#/runs/${encodeURIComponent(interrupt.run_id)}`;
  link.textContent = interrupt.run_id;
  node.querySelector(".action").textContent = action.tool
    ? `${action.tool} ${JSON.stringify(action.arguments)}`
    : interrupt.kind;
  node.querySelector(".blast").textContent = action.blast_radius || "—";
  node.querySelector(".roles").textContent = (interrupt.approver_roles || []).join(", ") || "—";
  node.querySelector(".expires").textContent = when(interrupt.expires_at) || "never";
  const reason = node.querySelector(".reason");
  reason.id = `reason-${interrupt.interrupt_id}`;
  const decide = async (verb, body) => {
    try {
      await api(`/v1/interrupts/${encodeURIComponent(interrupt.interrupt_id)}/${verb}`, {
        method: "POST",
        body: JSON.stringify(body),
      });
      say(verb === "approve" ? "Approved." : "Denied.", true);
      node.remove();
      await after();
    } catch (error) {
      say(`${error.message}. ${error.hint}`);
    }
  };
  const hash = action.hash;
  node.querySelector(".approve").addEventListener("click", () =>
    decide("approve", hash ? { action_hash: hash } : {}),
  );
  node.querySelector(".deny").addEventListener("click", () =>
    decide("deny", { reason: reason.value }),
  );
  return node;
}

async function pending() {
  const { interrupts } = await api("/v1/interrupts");
  const waiting = interrupts.filter((i) => i.status === "pending");
  $("inbox-count").textContent = waiting.length ? `(${waiting.length})` : "";
  return waiting;
}

async function showInbox() {
  show("inbox");
  const waiting = await pending();
  $("interrupts").replaceChildren(...waiting.map((i) => card(i, showInbox)));
  $("no-interrupts").hidden = waiting.length > 0;
}

// -- one run, live -----------------------------------------------------------------------------

async function showRun(runId) {
  show("run");
  $("run-id").textContent = runId;
  $("timeline").replaceChildren();
  const run = await api(`/v1/runs/${encodeURIComponent(runId)}`);
  setStatus(run.status);
  $("run-agent").textContent = `· ${run.agent.name}`;
  await runInterrupts(runId);
  following = new AbortController();
  follow(runId, following.signal).catch((error) => {
    if (error.name !== "AbortError") say(error.message);
  });
}

function setStatus(status) {
  const node = $("run-status");
  node.textContent = status;
  node.className = `status-${status}`;
}

async function runInterrupts(runId) {
  const waiting = (await pending()).filter((i) => i.run_id === runId);
  $("run-interrupts").replaceChildren(...waiting.map((i) => card(i, () => runInterrupts(runId))));
}

const STATUS_OF = {
  run_completed: "completed",
  run_failed: "failed",
  run_cancelled: "cancelled",
  run_expired: "expired",
  interrupt_raised: "input_required",
  approval_granted: "queued",
  approval_denied: "queued",
  interrupt_answered: "queued",
  run_started: "running",
};

// Server-Sent Events read with fetch (EventSource cannot send the token), resumed after a
// dropped connection from the last id received.
async function follow(runId, signal) {
  let last = 0;
  const path = `/v1/runs/${encodeURIComponent(runId)}/events/stream`;
  while (!signal.aborted) {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${token}`, "Last-Event-ID": String(last) },
      signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || response.statusText);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const fields = {};
        for (const line of buffer.slice(0, cut).split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const at = line.indexOf(":");
          fields[line.slice(0, at)] = line.slice(at + 1).replace(/^ /, "");
        }
        buffer = buffer.slice(cut + 2);
        if (!fields.data) continue;
        const data = JSON.parse(fields.data);
        if (fields.event === "end") {
          setStatus(data.status);
          return;
        }
        last = Number(fields.id);
        addEvent(data);
        if (STATUS_OF[data.type]) setStatus(STATUS_OF[data.type]);
        if (data.type === "interrupt_raised") await runInterrupts(runId);
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function addEvent(data) {
  const item = document.createElement("li");
  item.dataset.type = data.type;
  const type = document.createElement("span");
  type.className = "type";
  type.textContent = `#${data.seq} ${data.type}`;
  item.append(type, ` ${data.line}`);
  $("timeline").append(item);
}

// -- routing -----------------------------------------------------------------------------------

async function route() {
  if (following) following.abort();
  following = null;
  clearInterval(refreshing);
  if (!token) {
    show("sign-in");
    $("token").focus();
    return;
  }
  const hash = location.hash || "#/runs";
  try {
    if (hash.startsWith("#/runs/")) {
      await showRun(decodeURIComponent(hash.slice("#/runs/".length)));
    } else if (hash === "#/inbox") {
      await showInbox();
      refreshing = setInterval(() => showInbox().catch(() => {}), 2000);
    } else {
      await showRuns();
      refreshing = setInterval(() => showRuns().catch(() => {}), 2000);
      await pending();
    }
  } catch (error) {
    if (error.status === 401) {
      token = "";
      sessionStorage.removeItem("contextos.token");
      show("sign-in");
    }
    say(`${error.message}. ${error.hint || ""}`);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("sign-in").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (await signIn($("token").value.trim())) {
      $("token").value = "";
      await route();
    }
  });
  $("sign-out").addEventListener("click", () => {
    token = "";
    sessionStorage.removeItem("contextos.token");
    say("");
    route();
  });
  $("status-filter").addEventListener("change", () => showRuns().catch((e) => say(e.message)));
  window.addEventListener("hashchange", () => {
    say("");
    route();
  });
  if (token && !(await signIn(token))) token = "";
  await route();
});
