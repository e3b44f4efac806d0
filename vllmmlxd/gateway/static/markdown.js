// A small Markdown renderer for model answers, safe by construction: the text is HTML-escaped
// before anything else, and the only tags in the output are the ones written here. Links keep
// http(s) targets only. Handles fenced code (an unclosed fence, as while streaming, runs to the
// end), inline code, bold, italic, headings, lists, quotes and paragraphs.
"use strict";

(function (global) {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  // Inline spans of one block, on text that is already escaped.
  function renderInline(escaped) {
    const codes = [];
    // Code spans first, set aside so that nothing inside them is formatted.
    let out = escaped.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, ticks, code) => {
      codes.push("<code>" + code.trim() + "</code>");
      return "\u0000" + (codes.length - 1) + "\u0000";
    });
    // [text](http://...) — the target was escaped with the rest, so it cannot leave the attribute.
    out = out.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()\u0000]+)\)/g,
      (_, label, href) => '<a href="' + href + '" target="_blank" rel="noopener noreferrer">' + label + "</a>");
    out = out.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>");
    out = out.replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>");
    out = out.replace(/(^|[^*\w])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![*\w])/g, "$1<em>$2</em>");
    out = out.replace(/(^|[^_\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?![_\w])/g, "$1<em>$2</em>");
    return out.replace(/\u0000(\d+)\u0000/g, (_, i) => codes[Number(i)]);
  }

  function renderCode(lines, lang) {
    const cls = /^[\w+-]+$/.test(lang) ? ' class="language-' + lang + '"' : "";
    return "<pre><code" + cls + ">" + escapeHtml(lines.join("\n")) + "</code></pre>";
  }

  const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

  // Block structure, line by line: fences, headings, lists, quotes, rules, paragraphs.
  function renderBlocks(lines) {
    const html = [];
    let para = [];
    const flush = () => {
      if (para.length) html.push("<p>" + para.map((l) => renderInline(escapeHtml(l))).join("<br>") + "</p>");
      para = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([^`\s]*)/);
      if (fence) {
        flush();
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i++; // the closing fence (or past the end while it is still streaming)
        html.push(renderCode(body, fence[2]));
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
      if (heading) {
        flush();
        const n = heading[1].length;
        html.push("<h" + n + ">" + renderInline(escapeHtml(heading[2])) + "</h" + n + ">");
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush();
        html.push("<hr>");
        i++;
        continue;
      }
      if (LIST_ITEM.test(line)) {
        flush();
        const ordered = /^\s*\d/.test(line);
        const items = [];
        while (i < lines.length) {
          const m = lines[i].match(LIST_ITEM);
          if (m && /^\s*\d/.test(lines[i]) === ordered) items.push(m[3]);
          else if (lines[i].trim() && /^\s+/.test(lines[i]) && items.length) items[items.length - 1] += " " + lines[i].trim();
          else break;
          i++;
        }
        const tag = ordered ? "ol" : "ul";
        html.push("<" + tag + ">" + items.map((t) => "<li>" + renderInline(escapeHtml(t)) + "</li>").join("") + "</" + tag + ">");
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        html.push("<blockquote>" + renderBlocks(quoted) + "</blockquote>");
        continue;
      }
      if (!line.trim()) flush();
      else para.push(line);
      i++;
    }
    flush();
    return html.join("");
  }

  function renderMarkdown(text) {
    const clean = String(text || "").replace(/\u0000/g, "").replace(/\r\n?/g, "\n");
    return renderBlocks(clean.split("\n"));
  }

  global.Markdown = { render: renderMarkdown, escapeHtml: escapeHtml };
})(typeof window !== "undefined" ? window : globalThis);
