// md.js — the page's markdown renderer (window.MoeMarkdown). Turns model output into DOM
// nodes: headings, paragraphs, emphasis (**bold**, *italic*, ~~strike~~), `inline code`,
// fenced code blocks (with a Copy button), bullet and numbered lists, block quotes, tables,
// horizontal rules and links; a backslash makes the punctuation after it literal (\*).
// Safety invariant: no text from the input ever reaches innerHTML or an attribute other than
// a link's href; every piece of text is a text node. A link is made only for an http(s) URL
// (anything else, javascript: included, stays text) and opens with rel="noopener noreferrer".
// An unclosed code fence (a reply still streaming) renders as a code block to the end.
"use strict";

(function () {
  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const ITEM = /^( *)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  // Inline syntax, leftmost match first; at one position the earlier alternative wins.
  const INLINE = new RegExp([
    "(`+)",                                                   // 1: code span opener
    "\\[([^\\]\\n]*)\\]\\(\\s*<?([^\\s()<>]+)>?(?:\\s+\"[^\"]*\")?\\s*\\)",  // 2,3: [text](url)
    "<(https?://[^\\s<>]+)>",                                 // 4: <http://...>
    "(https?://[^\\s<>()\\[\\]]*[^\\s<>()\\[\\].,;:!?'\"])",   // 5: bare URL
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",                      // 6: **bold**
    "(?<![\\w])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w])",           // 7: __bold__
    "~~(?=\\S)([\\s\\S]*?\\S)~~",                              // 8: ~~strike~~
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*(?!\\*)",             // 9: *italic*
    "(?<![\\w])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w])",     // 10: _italic_
    "\\\\([!-/:-@\\[-`{-~])",                                 // 11: \* and other escapes
  ].join("|"), "g");

  function safeHref(url) {
    try {
      const u = new URL(url);
      return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
    } catch (e) {
      return null;
    }
  }

  function link(doc, parent, text, url) {
    const href = safeHref(url);
    if (!href) {  // not http(s): shown as the text it was
      parent.appendChild(doc.createTextNode(text === url ? url : "[" + text + "](" + url + ")"));
      return;
    }
    const a = doc.createElement("a");
    a.href = href;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    inline(doc, a, text, true);
    parent.appendChild(a);
  }

  // Appends the inline content of `text` to parent. inLink: no links inside links.
  function inline(doc, parent, text, inLink) {
    const re = new RegExp(INLINE.source, "g");
    let pos = 0;
    let m;
    const plain = (s) => { if (s) parent.appendChild(doc.createTextNode(s)); };
    while ((m = re.exec(text)) !== null) {
      if (m[1] !== undefined) {  // code span: up to the next run of the same length
        const run = m[1];
        const close = text.indexOf(run, m.index + run.length);
        let end = close;
        while (end >= 0 && text[end + run.length] === "`") end = text.indexOf(run, end + 1);
        if (end < 0) { re.lastIndex = m.index + run.length; continue; }  // literal backticks
        plain(text.slice(pos, m.index));
        const code = doc.createElement("code");
        let body = text.slice(m.index + run.length, end);
        if (/^ .*[^ ].* $/s.test(body)) body = body.slice(1, -1);
        code.textContent = body;
        parent.appendChild(code);
        pos = re.lastIndex = end + run.length;
        continue;
      }
      if (inLink && (m[2] !== undefined || m[4] !== undefined || m[5] !== undefined)) {
        re.lastIndex = m.index + 1;
        continue;
      }
      plain(text.slice(pos, m.index));
      if (m[11] !== undefined) plain(m[11]);
      else if (m[2] !== undefined) link(doc, parent, m[2], m[3]);
      else if (m[4] !== undefined) link(doc, parent, m[4], m[4]);
      else if (m[5] !== undefined) link(doc, parent, m[5], m[5]);
      else {
        const tag = m[6] !== undefined || m[7] !== undefined ? "strong" : m[8] !== undefined ? "del" : "em";
        const inner = m[6] ?? m[7] ?? m[8] ?? m[9] ?? m[10];
        const el = doc.createElement(tag);
        inline(doc, el, inner, inLink);
        parent.appendChild(el);
      }
      pos = re.lastIndex;
    }
    plain(text.slice(pos));
  }

  // Appends lines as one paragraph (soft line breaks kept as <br>).
  function paragraph(doc, parent, lines) {
    const p = doc.createElement("p");
    lines.forEach((l, i) => {
      if (i > 0) p.appendChild(doc.createElement("br"));
      inline(doc, p, l.trim(), false);
    });
    parent.appendChild(p);
  }

  function cells(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
    return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  function table(doc, parent, head, sep, rows) {
    const align = cells(sep).map((c) => c.startsWith(":") && c.endsWith(":") ? "center"
                                      : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
    const wrap = doc.createElement("div");
    wrap.className = "md-table";
    const t = doc.createElement("table");
    const row = (cs, tag, into) => {
      const tr = doc.createElement("tr");
      for (let i = 0; i < align.length; i++) {
        const c = doc.createElement(tag);
        if (align[i]) c.style.textAlign = align[i];
        inline(doc, c, cs[i] || "", false);
        tr.appendChild(c);
      }
      into.appendChild(tr);
    };
    const thead = doc.createElement("thead");
    row(cells(head), "th", thead);
    t.appendChild(thead);
    const tbody = doc.createElement("tbody");
    for (const r of rows) row(cells(r), "td", tbody);
    t.appendChild(tbody);
    wrap.appendChild(t);
    parent.appendChild(wrap);
  }

  function codeBlock(doc, parent, lang, text, copy) {
    const box = doc.createElement("div");
    box.className = "codeblock";
    const head = doc.createElement("div");
    head.className = "codehead";
    const label = doc.createElement("span");
    label.textContent = lang || "code";
    head.appendChild(label);
    const btn = doc.createElement("button");
    btn.type = "button";
    btn.className = "copy-code";
    btn.textContent = "Copy";
    btn.addEventListener("click", () => copy(text, btn));
    head.appendChild(btn);
    const pre = doc.createElement("pre");
    const code = doc.createElement("code");
    code.textContent = text;
    pre.appendChild(code);
    box.appendChild(head);
    box.appendChild(pre);
    parent.appendChild(box);
  }

  // Renders the blocks of `lines` into parent.
  function blocks(doc, parent, lines, copy) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (line.trim() === "") { i++; continue; }
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(fence) &&
                                     lines[i].trim().replace(/[`~]/g, "") === "")) body.push(lines[i++]);
        i++;  // the closing fence (or past the end)
        codeBlock(doc, parent, m[2], body.join("\n"), copy);
        continue;
      }
      if ((m = HEADING.exec(line))) {
        const h = doc.createElement("h" + Math.min(6, m[1].length + 2));  // h3..h6: inside a bubble
        h.className = "md-h" + m[1].length;
        inline(doc, h, m[2], false);
        parent.appendChild(h);
        i++;
        continue;
      }
      if (RULE.test(line)) {
        parent.appendChild(doc.createElement("hr"));
        i++;
        continue;
      }
      if (QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) { inner.push(m[1]); i++; }
        const q = doc.createElement("blockquote");
        blocks(doc, q, inner, copy);
        parent.appendChild(q);
        continue;
      }
      if ((m = ITEM.exec(line))) {
        i = list(doc, parent, lines, i, copy);
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) &&
          lines[i + 1].includes("-")) {
        const head = line, sep = lines[i + 1];
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].trim() !== "" && lines[i].includes("|")) rows.push(lines[i++]);
        table(doc, parent, head, sep, rows);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && !FENCE.test(lines[i]) &&
             !HEADING.test(lines[i]) && !QUOTE.test(lines[i]) && !RULE.test(lines[i]) &&
             !(para.length > 0 && ITEM.test(lines[i]))) para.push(lines[i++]);
      if (para.length === 0) para.push(lines[i++]);
      paragraph(doc, parent, para);
    }
  }

  // A list starting at lines[start]; returns the index after it. Items are the lines with the
  // list's indentation and kind (bullet or number); deeper-indented lines belong to the item
  // above (nested lists, continuation text, code).
  function list(doc, parent, lines, start, copy) {
    const first = ITEM.exec(lines[start]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const el = doc.createElement(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) el.start = parseInt(first[2], 10);
    let i = start;
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
      const body = [m[3]];
      const contentIndent = indent + m[2].length + 1;
      i++;
      while (i < lines.length) {
        const l = lines[i];
        const lead = l.length - l.trimStart().length;
        if (l.trim() === "") {
          // A blank line continues the item only if indented text follows.
          const next = lines[i + 1];
          if (next !== undefined && next.trim() !== "" && next.length - next.trimStart().length > indent) {
            body.push("");
            i++;
            continue;
          }
          break;
        }
        if (lead <= indent && ITEM.test(l)) break;
        if (lead <= indent && (FENCE.test(l) || HEADING.test(l) || QUOTE.test(l))) break;
        body.push(l.slice(Math.min(lead, contentIndent)));
        i++;
      }
      const li = doc.createElement("li");
      if (body.length === 1) inline(doc, li, body[0], false);
      else blocks(doc, li, body, copy);
      // A tight item's leading paragraph is shown without its <p> margins.
      if (!body.includes("") && li.firstChild && li.firstChild.nodeName === "P") {
        const p = li.firstChild;
        while (p.firstChild) li.insertBefore(p.firstChild, p);
        p.remove();
      }
      el.appendChild(li);
      if (i < lines.length && lines[i].trim() === "") {
        const next = lines[i + 1];
        const nm = next !== undefined && ITEM.exec(next);
        if (nm && nm[1].length === indent && /\d/.test(nm[2]) === ordered) i++;  // loose list
      }
    }
    parent.appendChild(el);
    return i;
  }

  // Renders markdown `text` into a new DocumentFragment. copy(text, button): what a code
  // block's Copy button calls.
  function render(text, copy, doc) {
    doc = doc || document;
    const frag = doc.createDocumentFragment();
    blocks(doc, frag, String(text).replace(/\r\n?/g, "\n").split("\n"), copy || (() => {}));
    return frag;
  }

  window.MoeMarkdown = { render, safeHref };
})();
