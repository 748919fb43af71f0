// The ask page's streaming answer: server-sent events from /ask/stream (plan, tools, evidence,
// token..., done; see search.services.AskEvent). Evidence and answers are untrusted text, so
// everything is rendered with textContent / text nodes; the one exception is the finished
// answer's done.html, which the server rendered from Markdown and sanitised with nh3
// (search.rendering.answer_html). Without JavaScript the form does a plain GET and the server
// renders the whole answer. Every answer is a turn of a conversation: done.conversation_id goes
// into the form, so the next question is a follow-up, and the finished turn moves up into
// #turns (its source ids renamed, so that each turn's [n] keeps pointing at its own sources).
(function () {
  "use strict";
  const form = document.getElementById("ask-form");
  if (!form || !window.EventSource || !window.fetch) return;
  const $ = (id) => document.getElementById(id);
  const live = $("live");
  let source = null;
  let finishedTurn = false; // the live card holds a finished answer, to move up on the next question

  function node(tag, text, className) {
    const n = document.createElement(tag);
    if (text !== undefined && text !== null) n.textContent = String(text);
    if (className) n.className = className;
    return n;
  }

  // Only http(s), mailto and same-site paths become links (the server already checks; this is
  // the second wall against a "javascript:" URL coming from a document).
  function safeHref(url) {
    return typeof url === "string" && /^(https?:\/\/|mailto:|\/(?![\/\\]))/i.test(url) ? url : "";
  }

  function truncate(text, n) {
    text = String(text || "");
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  // The finished answer: the server's sanitised HTML (its [n] are links to #source-n).
  function renderAnswer(done) {
    const live = $("live-answer");
    const rendered = $("live-answer-html");
    if (typeof done.html === "string") {
      rendered.innerHTML = done.html; // sanitised server-side (search.rendering.answer_html)
      rendered.hidden = false;
      live.hidden = true;
    } else {
      live.replaceChildren(document.createTextNode(done.text || ""));
    }
  }

  // A click on [n] highlights source n (the :target style does the same without JavaScript).
  document.addEventListener("click", (event) => {
    const link = event.target.closest ? event.target.closest("a.cite") : null;
    if (!link) return;
    const target = (link.getAttribute("href") || "").replace(/^#/, "");
    for (const li of document.querySelectorAll("ol.sources > li.highlight")) li.classList.remove("highlight");
    const item = target ? document.getElementById(target) : null;
    if (item) item.classList.add("highlight");
  });

  function renderTools(data) {
    const box = $("live-tools");
    box.replaceChildren("Tools: ");
    for (const t of data.tools_run || []) {
      const label = t.error ? t.tool + " failed" : t.tool + " · " + t.rows + " rows · " + Math.round(t.ms) + " ms";
      const tag = node("span", label, t.error ? "tag failed" : "tag");
      if (t.error) tag.title = t.error;
      box.append(tag, " ");
    }
    const errors = $("live-errors");
    errors.replaceChildren();
    for (const [call, message] of Object.entries(data.errors || {})) {
      errors.append(node("p", call + ": " + message, "error"));
    }
  }

  function renderSource(ev) {
    const li = node("li");
    li.id = "source-" + ev.n;
    li.value = ev.n;
    const href = safeHref(ev.link);
    if (href) {
      const a = node("a", ev.title);
      a.href = href;
      a.rel = "noopener noreferrer";
      li.append(a);
    } else {
      li.append(node("span", ev.title));
    }
    const when = ev.updated_at ? " · " + String(ev.updated_at).slice(0, 10) : "";
    li.append(" ", node("span", ev.kind, "tag"), " ", node("span", (ev.location || "") + when, "muted"));
    if (ev.sections && ev.sections.length) {
      li.append(linkList(ev.sections.map((s) => [s.title, s.link, s.location || ""])));
    }
    const documents = ev.kind === "person" && ev.metadata && Array.isArray(ev.metadata.documents) ? ev.metadata.documents : [];
    if (documents.length) {
      // A person (who knows): the documents that credit them, each linked, instead of their text.
      li.append(linkList(documents.map((d) => [d.title, d.link, [d.role, d.location].filter(Boolean).join(" · ")])));
    } else {
      li.append(node("pre", truncate(ev.text, 600)));
    }
    return li;
  }

  // [[title, link, muted note], ...] as a list of linked titles (a title without a safe link as text).
  function linkList(items) {
    const list = node("ul", null, "sections");
    for (const [title, link, note] of items) {
      const item = node("li");
      const href = safeHref(link);
      if (href) {
        const a = node("a", title);
        a.href = href;
        a.rel = "noopener noreferrer";
        item.append(a);
      } else {
        item.append(node("span", title));
      }
      item.append(" ", node("span", note, "muted"));
      list.append(item);
    }
    return list;
  }

  function renderSources(done, evidence) {
    const list = $("live-sources");
    list.replaceChildren();
    const closest = new Set(done.closest || []);
    const shown = done.sources && done.sources.length ? done.sources : evidence.filter((ev) => closest.has(ev.n));
    $("live-sources-title").textContent = done.sources && done.sources.length ? "Sources" : "Closest, not answering";
    for (const ev of shown) list.append(renderSource(ev));
    $("live-sources-card").hidden = shown.length === 0;
  }

  // A verified answer to the same question, shown above the fresh one: the server's sanitised
  // HTML (done.verified.html), who verified it and when, and whether a cited source changed since.
  function renderVerified(verified) {
    const box = $("live-verified");
    box.replaceChildren();
    if (!verified || typeof verified.html !== "string") return;
    const card = node("div", null, "card verified");
    const head = node("p");
    head.append(node("strong", "Verified answer"), " ");
    let meta = "· verified by " + verified.verified_by + " on " + String(verified.verified_at || "").slice(0, 10);
    if (verified.stale) meta += " · stale: a source it cites has changed or is gone since";
    head.append(node("span", meta, "muted"));
    const html = node("div", null, "answer");
    html.innerHTML = verified.html; // sanitised server-side (search.rendering.answer_html)
    card.append(head, node("p", "To: " + verified.question, "muted"), html);
    if (verified.sources && verified.sources.length) {
      const list = node("ol", null, "sources");
      for (const ev of verified.sources) {
        const li = renderSource(ev);
        li.id = "v-source-" + ev.n;
        list.append(li);
      }
      card.append(list);
    }
    box.append(card);
  }

  function renderFeedback(answerId) {
    const box = $("live-feedback");
    box.replaceChildren();
    if (!answerId) return;
    const feedbackForm = $("feedback-form").content.firstElementChild.cloneNode(true);
    feedbackForm.action = form.dataset.feedbackUrl.replace("00000000-0000-0000-0000-000000000000", answerId);
    feedbackForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = new FormData(feedbackForm);
      body.set("vote", event.submitter ? event.submitter.value : "up");
      const status = feedbackForm.querySelector(".feedback-status");
      try {
        const response = await fetch(feedbackForm.action, {
          method: "POST", body: body, headers: { Accept: "application/json" }, credentials: "same-origin",
        });
        status.textContent = response.ok ? "Thanks, recorded." : "Could not record the feedback.";
      } catch (err) {
        status.textContent = "Could not record the feedback.";
      }
    });
    box.append(feedbackForm);
  }

  // The finished live turn, copied into #turns with its ids and citation links renamed "tK-source-n".
  function moveFinishedTurn() {
    if (!finishedTurn) return;
    finishedTurn = false;
    const turns = $("turns");
    const k = turns.children.length + 1;
    const card = node("div", null, "card turn");
    const copy = (id) => {
      const original = $(id);
      if (!original || original.hidden || !original.childNodes.length) return;
      const clone = original.cloneNode(true);
      clone.removeAttribute("id");
      card.append(clone);
    };
    const verified = $("live-verified").firstElementChild;
    if (verified) card.append(verified.cloneNode(true)); // the verified answer shown with this turn
    for (const id of ["live-question", "live-rewrite", "live-answer-html", "live-answer", "live-meta"]) {
      if (id === "live-answer" && !$("live-answer-html").hidden) continue;
      const original = $(id);
      if (!original || original.hidden || !original.textContent.trim()) continue;
      const wrap = node(id === "live-question" ? "p" : "div", null, id === "live-question" ? "turn-question" : "");
      if (id === "live-rewrite" || id === "live-meta") wrap.className = "muted";
      const content = Array.from(original.cloneNode(true).childNodes);
      if (id === "live-question") {
        const strong = node("strong");
        strong.append(...content);
        wrap.append(strong);
      } else {
        wrap.append(...content);
      }
      card.append(wrap);
    }
    if (!$("live-sources-card").hidden) {
      copy("live-sources-title");
      copy("live-sources");
    }
    for (const el of card.querySelectorAll("[id]")) el.id = "t" + k + "-" + el.id;
    for (const el of card.querySelectorAll(".highlight")) el.classList.remove("highlight");
    for (const a of card.querySelectorAll("a.cite")) {
      a.setAttribute("href", "#t" + k + "-" + (a.getAttribute("href") || "").replace(/^#/, ""));
    }
    for (const f of card.querySelectorAll("form.feedback")) f.remove();
    turns.append(card);
  }

  // The live card cleared for a new question (the finished one moved up into the history).
  function reset(params) {
    if (source) source.close();
    moveFinishedTurn();
    for (const li of document.querySelectorAll("ol.sources > li.highlight")) li.classList.remove("highlight");
    live.hidden = false;
    $("static-result").hidden = true;
    for (const id of ["live-tools", "live-errors", "live-answer", "live-answer-html", "live-meta", "live-feedback", "live-sources", "live-rewrite", "live-verified"]) {
      $(id).replaceChildren();
    }
    $("live-answer").hidden = false;
    $("live-rewrite").hidden = true;
    $("live-question").textContent = params.get("q") || "";
    $("live-answer-html").hidden = true;
    $("live-sources-card").hidden = true;
    const status = $("live-status");
    status.className = "muted";
    status.textContent = "";
  }

  function start(params) {
    reset(params);
    const status = $("live-status");
    status.textContent = "Planning…";
    const answer = $("live-answer");
    let evidence = [];
    let finished = false;

    source = new EventSource(form.dataset.streamUrl + "?" + params.toString());
    const on = (type, handler) => source.addEventListener(type, (e) => handler(JSON.parse(e.data)));
    on("plan", (plan) => {
      status.textContent = "Planner " + plan.planner + " chose " + plan.tools.join(", ") + "; running…";
      if (plan.rewrite && plan.rewrite.method !== "none" && plan.standalone_question) {
        $("live-rewrite").textContent = "Understood as: " + plan.standalone_question;
        $("live-rewrite").hidden = false;
      }
    });
    on("tools", renderTools);
    on("evidence", (data) => {
      evidence = data.evidence || [];
      status.textContent = evidence.length ? "Writing the answer from " + evidence.length + " evidence blocks…" : "";
    });
    on("token", (data) => answer.append(document.createTextNode(data.text)));
    on("done", (done) => {
      finished = true;
      source.close();
      status.textContent = "";
      renderAnswer(done);
      const t = done.timings_ms || {};
      let meta = "synthesizer " + done.synthesizer + " · first text after " + Math.round(t.first_token || 0) +
        " ms · " + Math.round(t.total || 0) + " ms in all";
      if (done.fallback) meta += " · " + done.error;
      $("live-meta").textContent = meta;
      if (done.answer_id) {
        const share = node("a", "Share link");
        share.href = form.dataset.shareUrl.replace("00000000-0000-0000-0000-000000000000", done.answer_id);
        $("live-meta").append(" · ", share);
      }
      if (done.conversation_id) {
        $("conversation-id").value = done.conversation_id;
        const keep = new URLSearchParams({ conversation: done.conversation_id });
        if (params.get("project")) keep.set("project", params.get("project"));
        history.replaceState(null, "", form.action + "?" + keep.toString());
        form.querySelector('input[name="q"]').placeholder = "Ask a follow-up…";
      }
      finishedTurn = true;
      renderSources(done, evidence);
      renderVerified(done.verified);
      renderFeedback(done.answer_id);
    });
    on("failed", (data) => {
      finished = true;
      source.close();
      status.className = "error";
      status.textContent = data.message;
    });
    source.addEventListener("error", () => {
      if (finished) return;
      source.close(); // never let EventSource reconnect: that would ask the question again
      status.className = "error";
      status.replaceChildren("The live answer was interrupted. ");
      const retry = node("a", "Load the answer without streaming");
      retry.href = form.action + "?" + params.toString();
      status.append(retry);
    });
  }

  // The server's one limit and message (search.retrieval.clean_query), said before streaming:
  // a refused stream cannot show its message (EventSource reads only successful responses).
  function tooLong(question) {
    const max = parseInt(form.dataset.maxChars || "0", 10);
    const length = Array.from(question.trim().split(/\s+/).join(" ")).length;
    if (!max || length <= max) return "";
    return "the question is " + length.toLocaleString("en-US") + " characters long; at most " +
      max.toLocaleString("en-US") + " are allowed";
  }

  form.addEventListener("submit", (event) => {
    const params = new URLSearchParams(new FormData(form));
    if (!(params.get("q") || "").trim()) return; // the server explains an empty question
    const refusal = tooLong(params.get("q") || "");
    if (refusal) {
      event.preventDefault();
      reset(params); // shown under the refused question, not under the previous answer
      $("live-status").className = "error";
      $("live-status").textContent = refusal;
      return;
    }
    event.preventDefault();
    history.replaceState(null, "", form.action + "?" + params.toString());
    form.querySelector('input[name="q"]').value = "";
    start(params);
  });
})();
