// The chat page of `rlx serve`: plain JavaScript, no dependencies, no build
// step. It talks to the server's OpenAI-compatible API and keeps the
// conversations in localStorage.
'use strict';

const $ = (id) => document.getElementById(id);
const ui = {
  sidebar: $('sidebar'), scrim: $('scrim'), menu: $('menu'), sidebarClose: $('sidebar-close'),
  newChat: $('new-chat'), convList: $('conv-list'), model: $('model'), ctx: $('ctx'),
  settingsToggle: $('settings-toggle'), settings: $('settings'), form: $('settings-form'),
  apiKey: $('api-key'), messages: $('messages'), stats: $('stats'),
  composer: $('composer-form'), input: $('input'), send: $('send'), stop: $('stop'),
};

const STORE = 'rlx.chat.v1';            // {convs, current}
const DEFAULTS = 'rlx.chat.defaults';   // settings for new conversations
const API_KEY = 'rlx.chat.apiKey';      // one key for the whole server, not per chat
const FIELDS = ['temperature', 'top_p', 'top_k', 'max_tokens', 'seed'];
const WHOLE = new Set(['top_k', 'max_tokens', 'seed']);

let model = '';         // data[0].id of /v1/models
let contextLength = 0;  // tokens, 0 while unknown
let convs = [];         // {id, title, updated, settings, messages}
let currentId = null;
let busy = null;        // {conv, msg, ctrl} while a reply streams

// ---------------------------------------------------------------- storage

function uid() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function blankSettings() {
  const s = { system: '', thinking: false };
  for (const f of FIELDS) s[f] = '';
  return s;
}

function defaults() {
  try { return { ...blankSettings(), ...JSON.parse(localStorage.getItem(DEFAULTS) || '{}') }; }
  catch { return blankSettings(); }
}

function load() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE) || '{}');
    convs = Array.isArray(s.convs) ? s.convs : [];
    currentId = s.current;
  } catch { convs = []; }
  // A reply that was streaming when the page went away was cut short.
  for (const c of convs) {
    for (const m of c.messages) {
      if (m.streaming) { delete m.streaming; m.finish = m.finish || 'stopped'; }
    }
  }
  if (!current()) currentId = (convs[0] || newConv()).id;
}

let saveTimer = 0;
function save() {
  clearTimeout(saveTimer);
  saveTimer = 0;
  try { localStorage.setItem(STORE, JSON.stringify({ convs, current: currentId })); }
  catch (e) { ui.stats.textContent = `Could not save the chats: ${e.message}`; }
}

// While a reply streams, write at most once a second.
function saveLater() {
  if (!saveTimer) saveTimer = setTimeout(save, 1000);
}

function current() {
  return convs.find((c) => c.id === currentId);
}

function newConv() {
  const c = { id: uid(), title: '', updated: Date.now(), settings: defaults(), messages: [] };
  convs.unshift(c);
  return c;
}

function touch(conv) {
  conv.updated = Date.now();
  const first = conv.messages.find((m) => m.role === 'user');
  conv.title = first ? first.content.replace(/\s+/g, ' ').slice(0, 60) : '';
}

// ---------------------------------------------------------------- server

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = localStorage.getItem(API_KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The message of a failed response: OpenAI's {"error": {"message"}} shape,
// else the status and the start of the body.
async function errorOf(res) {
  const text = await res.text().catch(() => '');
  try {
    const e = JSON.parse(text).error;
    if (e) return typeof e === 'string' ? e : e.message || JSON.stringify(e);
  } catch { /* not JSON */ }
  return `HTTP ${res.status} ${res.statusText}${text ? `: ${text.slice(0, 300)}` : ''}`;
}

async function loadModel() {
  try {
    const res = await fetch('v1/models', { headers: headers() });
    if (res.status === 503) {  // still loading the weights
      ui.model.textContent = 'loading model…';
      setTimeout(loadModel, 2000);
      return;
    }
    if (res.status === 401) openSettings(true);
    if (!res.ok) throw new Error(await errorOf(res));
    const first = ((await res.json()).data || [])[0];
    if (!first) throw new Error('the server lists no model');
    model = first.id;
    contextLength = (first.meta && first.meta.n_ctx) || 0;
    ui.model.textContent = model;
  } catch (e) {
    ui.model.textContent = 'no model';
    ui.stats.textContent = `Could not reach the server: ${e.message}`;
    return;
  }
  try {
    const res = await fetch('api/show', {
      method: 'POST', headers: headers(), body: JSON.stringify({ model }),
    });
    if (res.ok) {
      const show = await res.json();
      const info = show.model_info || {};
      const key = Object.keys(info).find((k) => k.endsWith('.context_length'));
      contextLength = (key && info[key]) || show.context_length || contextLength;
    }
  } catch { /* the context length is a nicety */ }
  ui.ctx.textContent = contextLength ? `${contextLength.toLocaleString()} ctx` : '';
  showStats();
}

// The one place that turns stored messages into the API's. Images would go
// here: a user message with attachments becomes an array of content parts.
function toApi(m) {
  if (m.role === 'user') return { role: 'user', content: m.content };
  // Failed or empty replies stay on screen but are not sent back.
  if (m.role === 'assistant' && m.content) return { role: 'assistant', content: m.content };
  return null;
}

function requestBody(conv) {
  const s = conv.settings;
  const messages = [];
  if (s.system && s.system.trim()) messages.push({ role: 'system', content: s.system });
  for (const m of conv.messages) {
    const a = !m.streaming && toApi(m);
    if (!a) continue;
    const prev = messages[messages.length - 1];
    // Chat templates often insist that turns alternate; a failed reply
    // leaves two user turns in a row, so they go as one.
    if (a.role === 'user' && prev && prev.role === 'user' && typeof prev.content === 'string') {
      prev.content += `\n\n${a.content}`;
    } else {
      messages.push(a);
    }
  }
  const body = { model, messages, stream: true, stream_options: { include_usage: true } };
  // Only the fields the user set: the server's defaults apply to the rest.
  for (const f of FIELDS) {
    const v = String(s[f] ?? '').trim();
    if (v === '') continue;
    const n = Number(v);
    if (!Number.isFinite(n) || (WHOLE.has(f) && !Number.isInteger(n))) {
      throw new Error(`Setting ${f}: "${v}" is not a ${WHOLE.has(f) ? 'whole ' : ''}number`);
    }
    body[f] = n;
  }
  // Read by chat templates that can think before answering; the thoughts
  // come back as reasoning_content.
  if (s.thinking) body.chat_template_kwargs = { enable_thinking: true };
  return body;
}

// The `data:` payloads of a server-sent event stream.
async function* sseData(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (line === '') {
        if (data.length) yield data.join('\n');
        data = [];
      } else if (line.startsWith('data:')) {
        data.push(line.slice(5).replace(/^ /, ''));
      }  // event:, id: and comments carry nothing for us
    }
  }
  if (data.length) yield data.join('\n');
}

function applyDelta(msg, d) {
  if (typeof d.reasoning_content === 'string') msg.reasoning += d.reasoning_content;
  if (typeof d.content === 'string') msg.content += d.content;
  for (const t of Array.isArray(d.tool_calls) ? d.tool_calls : []) {
    // OpenAI streams a call as pieces under one index: id and name come
    // first, the arguments' JSON text in pieces after.
    const call = (msg.toolCalls[t.index ?? 0] ||= { id: '', name: '', arguments: '' });
    if (t.id) call.id = t.id;
    const f = t.function || {};
    if (f.name && !call.name) call.name = f.name;
    if (typeof f.arguments === 'string') call.arguments += f.arguments;
  }
}

async function generate(conv) {
  const msg = { id: uid(), role: 'assistant', content: '', reasoning: '', toolCalls: [], streaming: true };
  conv.messages.push(msg);
  touch(conv);
  const ctrl = new AbortController();
  busy = { conv, msg, ctrl };
  renderAll();
  const started = performance.now();
  let usage = null;
  let timings = null;
  let first = 0;
  try {
    const body = requestBody(conv);
    const res = await fetch('v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: ctrl.signal,
    });
    if (!res.ok) throw new Error(await errorOf(res));
    for await (const data of sseData(res.body)) {
      if (data === '[DONE]') break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      // llama-server puts `timings` on the chunk; rlx on the last choice.
      timings = chunk.timings || (choice && choice.timings) || timings;
      if (!choice) continue;
      first ||= performance.now();
      applyDelta(msg, choice.delta || {});
      if (choice.finish_reason) msg.finish = choice.finish_reason;
      paintSoon(msg);
      saveLater();
    }
  } catch (e) {
    if (e.name === 'AbortError') msg.finish = 'stopped';
    else msg.error = e.message || String(e);
  }
  msg.stats = measure(usage, timings, performance.now() - started, first && first - started);
  delete msg.streaming;
  if (!msg.toolCalls.length) delete msg.toolCalls;
  if (!msg.reasoning) delete msg.reasoning;
  busy = null;
  clearTimeout(paintTimer);
  paintTimer = 0;
  save();
  renderAll();
}

function stop() {
  if (busy) busy.ctrl.abort();
}

// ---------------------------------------------------------------- stats

function measure(usage, timings, ms, ttft) {
  const s = { ms: Math.round(ms) };
  if (ttft) s.ttft = Math.round(ttft);
  if (usage) {
    s.prompt = usage.prompt_tokens;
    s.completion = usage.completion_tokens;
  }
  if (timings && typeof timings === 'object') {
    s.timings = {};
    for (const [k, v] of Object.entries(timings)) if (typeof v === 'number') s.timings[k] = v;
  }
  return s;
}

function statsText(s) {
  const t = s.timings || {};
  const parts = [];
  if (s.completion != null) parts.push(`${s.completion} tokens`);
  // The server's decode rate if it sent one, else tokens over wall time.
  let rate = t.predicted_per_second;
  if (!(rate > 0) && s.completion > 0 && s.ms > 0) rate = s.completion / (s.ms / 1000);
  if (rate > 0) parts.push(`${rate.toFixed(1)} tok/s`);
  if (t.prompt_per_second > 0) parts.push(`prompt ${Math.round(t.prompt_per_second)} tok/s`);
  if (t.cache_n > 0) parts.push(`${t.cache_n} cached`);
  if (s.ttft) parts.push(`first token ${(s.ttft / 1000).toFixed(2)} s`);
  parts.push(`${(s.ms / 1000).toFixed(1)} s`);
  if (s.prompt != null) {
    const used = s.prompt + (s.completion || 0);
    parts.push(contextLength
      ? `context ${used} / ${contextLength} (${Math.round((100 * used) / contextLength)}%)`
      : `context ${used} tokens`);
  }
  return parts.join(' · ');
}

// The stats line tells of the current conversation's last reply.
function showStats() {
  const conv = current();
  const last = conv && [...conv.messages].reverse().find((m) => m.role === 'assistant');
  if (!last || last.streaming) {
    ui.stats.textContent = busy ? 'Generating…' : '';
    ui.stats.title = '';
    return;
  }
  ui.stats.textContent = last.stats ? statsText(last.stats) : '';
  const t = (last.stats && last.stats.timings) || {};
  ui.stats.title = Object.entries(t).map(([k, v]) => `${k}: ${+v.toFixed(2)}`).join('\n');
}

// ---------------------------------------------------------------- markdown

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

const lead = (line) => line.match(/^\s*/)[0].length;

function link(url, label) {
  return `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`;
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>')
    .replace(/(^|\W)__(?=\S)([\s\S]*?\S)__(?!\w)/g, '$1<strong>$2</strong>')
    .replace(/\*(?=[^\s*])([\s\S]*?[^\s*])\*/g, '<em>$1</em>')
    .replace(/(^|\W)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/g, '$1<em>$2</em>')
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
}

// Inline Markdown of one block. The text is escaped first; code spans and
// links are then set aside as \0N\0 so emphasis can't reach into them.
function inline(text) {
  const kept = [];
  const keep = (html) => `\0${kept.push(html) - 1}\0`;
  let s = esc(text.replace(/\0/g, ''));
  s = s.replace(/(`+)(.+?)\1(?!`)/g, (_, _ticks, code) => keep(`<code>${code.trim()}</code>`));
  s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g,
    (_, label, url) => keep(link(url, emphasis(label))));
  // Bare URLs end before an escaped quote or bracket and trailing punctuation.
  s = s.replace(/\bhttps?:\/\/[^\s\0]+/g, (m) => {
    const cut = m.search(/&(?:quot|#39|lt|gt);|[.,;:!?)\]*_]+$/);
    let end = cut < 0 ? m.length : cut;
    const opened = (t) => t.split('(').length - t.split(')').length;
    if (m[end] === ')' && opened(m.slice(0, end)) > 0) end++;  // https://w.org/a_(b)
    return end > 8 ? keep(link(m.slice(0, end), m.slice(0, end))) + m.slice(end) : m;
  });
  s = emphasis(s).replace(/\n/g, '<br>');
  while (s.includes('\0')) s = s.replace(/\0(\d+)\0/g, (_, i) => kept[i]);
  return s;
}

function codeBlock(code, lang) {
  return `<div class="code"><div class="code-head"><span>${esc(lang)}</span>`
    + '<button type="button" class="copy-code" aria-label="Copy code">Copy</button></div>'
    + `<pre><code>${esc(code)}</code></pre></div>`;
}

function isTable(lines, i) {
  return lines[i].includes('|') && i + 1 < lines.length
    && lines[i + 1].includes('|') && TABLE_SEP.test(lines[i + 1]);
}

function startsBlock(lines, i) {
  const l = lines[i];
  return FENCE.test(l) || HEADING.test(l) || RULE.test(l) || QUOTE.test(l)
    || ITEM.test(l) || isTable(lines, i);
}

function cells(line) {
  return line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
}

function table(lines, i) {
  const head = cells(lines[i]);
  const align = cells(lines[i + 1]).map((c) => {
    if (c.startsWith(':') && c.endsWith(':')) return 'center';
    return c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '';
  });
  const row = (cs, tag) => `<tr>${head.map((_, k) => {
    const style = align[k] ? ` style="text-align:${align[k]}"` : '';
    return `<${tag}${style}>${inline(cs[k] || '')}</${tag}>`;
  }).join('')}</tr>`;
  let html = `<div class="table-wrap"><table><thead>${row(head, 'th')}</thead><tbody>`;
  for (i += 2; i < lines.length && lines[i].includes('|') && lines[i].trim(); i++) {
    html += row(cells(lines[i]), 'td');
  }
  return [`${html}</tbody></table></div>`, i];
}

// A list from lines[i]: items at its indent, deeper lines belong to the item
// above (parsed again, so nested lists work).
function list(lines, i) {
  const first = lines[i].match(ITEM);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const sibling = (m) => m && m[1].length <= indent + 1 && /\d/.test(m[2]) === ordered;
  const items = [];
  let item = null;
  for (; i < lines.length; i++) {
    const line = lines[i];
    const m = line.match(ITEM);
    if (sibling(m)) {
      item = [m[3]];
      item.pad = m[1].length + m[2].length + 1;
      items.push(item);
    } else if (!line.trim()) {
      const next = lines[i + 1];
      if (next === undefined || !(sibling(next.match(ITEM)) || lead(next) > indent)) break;
      item.push('');
    } else if (lead(line) > indent) {
      item.push(line.slice(Math.min(lead(line), item.pad)));
    } else if (item[item.length - 1].trim() && !startsBlock(lines, i)) {
      item.push(line);  // a paragraph's lazy continuation
    } else {
      break;
    }
  }
  const tag = ordered ? 'ol' : 'ul';
  const start = ordered && parseInt(first[2], 10) !== 1 ? ` start="${parseInt(first[2], 10)}"` : '';
  // A tight item's first paragraph goes without <p>.
  const body = items.map((it) => `<li>${markdown(it.join('\n')).replace(/^<p>([\s\S]*?)<\/p>/, '$1')}</li>`);
  return [`<${tag}${start}>${body.join('')}</${tag}>`, i];
}

function markdown(src) {
  const lines = src.replace(/\r\n?/g, '\n').split('\n');
  let html = '';
  for (let i = 0; i < lines.length;) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      // An unclosed fence (still streaming) runs to the end.
      const close = new RegExp(`^ {0,3}\\${m[1][0]}{${m[1].length},}\\s*$`);
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++;
      html += codeBlock(body.join('\n'), m[2]);
    } else if ((m = line.match(HEADING))) {
      const n = m[1].length;
      html += `<h${n}>${inline(m[2])}</h${n}>`;
      i++;
    } else if (RULE.test(line)) {
      html += '<hr>';
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) body.push(lines[i].replace(QUOTE, ''));
      html += `<blockquote>${markdown(body.join('\n'))}</blockquote>`;
    } else if (ITEM.test(line)) {
      let h;
      [h, i] = list(lines, i);
      html += h;
    } else if (isTable(lines, i)) {
      let h;
      [h, i] = table(lines, i);
      html += h;
    } else if (!line.trim()) {
      i++;
    } else {
      const para = [line.trim()];
      for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines, i); i++) {
        para.push(lines[i].trim());
      }
      html += `<p>${inline(para.join('\n'))}</p>`;
    }
  }
  return html;
}

// ---------------------------------------------------------------- rendering

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== false && v != null) e.setAttribute(k, v === true ? '' : v);
  }
  e.append(...children);
  return e;
}

// Fills a message's element from the message; called again as it streams.
function fill(node, msg) {
  node.dataset.state = msg.streaming ? 'streaming' : 'done';
  node.setAttribute('aria-busy', msg.streaming ? 'true' : 'false');
  const content = node.querySelector('.content');
  if (msg.role === 'user') {
    content.textContent = msg.content;
    return;
  }
  const think = node.querySelector('.thinking');
  think.hidden = !msg.reasoning;
  think.querySelector('summary').textContent =
    msg.streaming && !msg.content ? 'Thinking…' : 'Thoughts';
  think.querySelector('.thinking-body').textContent = msg.reasoning || '';

  const tools = node.querySelector('.tool-calls');
  tools.replaceChildren(...(msg.toolCalls || []).map((c) => {
    let args = c.arguments;
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial JSON */ }
    return h('div', { class: 'tool-call', 'data-testid': 'tool-call' },
      h('div', { class: 'tool-name' }, 'Tool call: ', h('code', {}, c.name || '…')),
      h('pre', {}, args));
  }));

  content.innerHTML = markdown(msg.content);  // markdown() escapes all model text

  const note = node.querySelector('.note');
  let text = '';
  if (msg.error) text = `Error: ${msg.error}`;
  else if (msg.finish === 'length') text = 'The reply was cut off at the token limit.';
  else if (msg.finish === 'stopped') text = 'Stopped.';
  note.textContent = text;
  note.hidden = !text;
  note.classList.toggle('error', !!msg.error);
}

function messageEl(msg, isLast) {
  const actions = h('div', { class: 'actions' });
  const node = h('article', {
    class: `msg ${msg.role}`, 'data-testid': 'message', 'data-role': msg.role, 'data-id': msg.id,
    'aria-label': msg.role === 'user' ? 'Your message' : 'Reply',
  });
  if (msg.role === 'assistant') {
    node.append(
      h('details', { class: 'thinking', hidden: true },
        h('summary', {}, 'Thoughts'), h('div', { class: 'thinking-body' })),
      h('div', { class: 'tool-calls' }),
      h('div', { class: 'content md' }),
      h('p', { class: 'note', role: 'status', hidden: true }));
    if (msg.content) {
      actions.append(h('button', {
        type: 'button', class: 'btn small', 'aria-label': 'Copy reply',
        onclick: (e) => copyText(msg.content, e.currentTarget),
      }, 'Copy'));
    }
  } else {
    node.append(h('div', { class: 'content' }));
    actions.append(h('button', {
      type: 'button', class: 'btn small', 'data-testid': 'edit', 'aria-label': 'Edit message',
      disabled: !!busy, onclick: () => startEdit(msg, node),
    }, 'Edit'));
  }
  if (isLast && !busy) {
    actions.append(h('button', {
      type: 'button', class: 'btn small', 'data-testid': 'regenerate',
      'aria-label': 'Regenerate reply', onclick: regenerate,
    }, 'Regenerate'));
  }
  if (!msg.streaming) node.append(actions);
  fill(node, msg);
  return node;
}

function nearBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function renderMessages() {
  const conv = current();
  const msgs = conv.messages;
  ui.messages.replaceChildren(...(msgs.length
    ? msgs.map((m, i) => messageEl(m, i === msgs.length - 1))
    : [h('p', { class: 'empty' }, 'Send a message to start.')]));
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

// Re-rendering the whole Markdown on each token is wasteful on long replies:
// paint at most every 50 ms, but the first piece at once.
let paintTimer = 0;
let lastPaint = 0;
function paintSoon(msg) {
  if (paintTimer) return;
  const wait = 50 - (performance.now() - lastPaint);
  if (wait <= 0) paint(msg);
  else paintTimer = setTimeout(() => { paintTimer = 0; paint(msg); }, wait);
}

function paint(msg) {
  lastPaint = performance.now();
  const node = ui.messages.querySelector(`[data-id="${msg.id}"]`);
  if (!node) return;  // its conversation is not on screen
  const stick = nearBottom();
  fill(node, msg);
  if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
}

function renderSidebar() {
  const sorted = [...convs].sort((a, b) => b.updated - a.updated);
  ui.convList.replaceChildren(...sorted.map((c) => {
    const title = c.title || 'New chat';
    const here = c.id === currentId;
    return h('li', { class: here ? 'conv current' : 'conv' },
      h('button', {
        type: 'button', class: 'conv-open', 'aria-current': here ? 'true' : false,
        title, onclick: () => switchTo(c.id),
      }, title),
      h('button', {
        type: 'button', class: 'icon conv-del', 'aria-label': `Delete conversation: ${title}`,
        onclick: () => remove(c.id),
      }, '×'));
  }));
}

function renderAll() {
  renderSidebar();
  renderMessages();
  fillSettings();
  showStats();
  ui.send.disabled = !!busy;
  ui.stop.hidden = !busy;
  document.title = current().title ? `${current().title} – rlx` : 'rlx chat';
}

// ---------------------------------------------------------------- actions

function submit() {
  const text = ui.input.value.trim();
  if (busy || !text) return;
  ui.input.value = '';
  grow();
  const conv = current();
  conv.messages.push({ id: uid(), role: 'user', content: text });
  generate(conv);
}

function regenerate() {
  const conv = current();
  if (busy) return;
  if (conv.messages.length && conv.messages[conv.messages.length - 1].role === 'assistant') {
    conv.messages.pop();
  }
  if (conv.messages.length) generate(conv);
}

function startEdit(msg, node) {
  const box = h('textarea', { class: 'edit', 'data-testid': 'edit-input', 'aria-label': 'Edit message' });
  box.value = msg.content;
  const commit = () => {
    const text = box.value.trim();
    if (!text || busy) return;
    const conv = current();
    msg.content = text;
    conv.messages.splice(conv.messages.indexOf(msg) + 1);  // what followed is gone
    generate(conv);
  };
  box.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); commit(); }
    if (e.key === 'Escape') renderMessages();
  });
  node.querySelector('.content').replaceWith(h('div', { class: 'edit-box' }, box,
    h('div', { class: 'row' },
      h('button', { type: 'button', class: 'btn primary', 'data-testid': 'edit-save', onclick: commit },
        'Save & send'),
      h('button', { type: 'button', class: 'btn', onclick: renderMessages }, 'Cancel'))));
  node.querySelector('.actions').remove();
  box.focus();
}

function switchTo(id) {
  // Empty chats other than the one shown are not worth keeping.
  convs = convs.filter((c) => c.messages.length || c.id === id || (busy && busy.conv === c));
  currentId = id;
  save();
  renderAll();
  openSidebar(false);
  ui.input.focus();
}

function remove(id) {
  const conv = convs.find((c) => c.id === id);
  if (!conv || (conv.messages.length && !confirm(`Delete "${conv.title || 'New chat'}"?`))) return;
  if (busy && busy.conv === conv) stop();
  convs = convs.filter((c) => c !== conv);
  if (id === currentId) currentId = (convs[0] || newConv()).id;
  save();
  renderAll();
}

function newChat() {
  if (current().messages.length) switchTo(newConv().id);
  else { openSidebar(false); ui.input.focus(); }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API off https and localhost: copy a selection instead.
    const t = h('textarea', { class: 'sr-only' });
    t.value = text;
    document.body.append(t);
    t.select();
    document.execCommand('copy');
    t.remove();
  }
  const was = button.textContent;
  button.textContent = 'Copied';
  setTimeout(() => { button.textContent = was; }, 1200);
}

// ---------------------------------------------------------------- panels

function openSidebar(open) {
  document.body.classList.toggle('sidebar-open', open);
  ui.scrim.hidden = !open;
  ui.menu.setAttribute('aria-expanded', String(open));
}

function openSettings(open) {
  ui.settings.hidden = !open;
  ui.settingsToggle.setAttribute('aria-expanded', String(open));
  if (open) ui.form.elements.system.focus();
}

function fillSettings() {
  const s = current().settings;
  for (const f of ['system', ...FIELDS]) ui.form.elements[f].value = s[f] ?? '';
  ui.form.elements.thinking.checked = !!s.thinking;
  ui.apiKey.value = localStorage.getItem(API_KEY) || '';
}

function grow() {
  // Shrink first so the height follows deletions too; CSS caps it.
  ui.input.style.height = 'auto';
  ui.input.style.height = `${ui.input.scrollHeight + 2}px`;
}

// ---------------------------------------------------------------- wiring

ui.composer.addEventListener('submit', (e) => { e.preventDefault(); submit(); });
ui.input.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
});
ui.input.addEventListener('input', grow);
ui.stop.addEventListener('click', stop);
ui.newChat.addEventListener('click', newChat);
ui.menu.addEventListener('click', () => openSidebar(true));
ui.sidebarClose.addEventListener('click', () => openSidebar(false));
ui.scrim.addEventListener('click', () => openSidebar(false));
ui.settingsToggle.addEventListener('click', () => openSettings(ui.settings.hidden));
$('settings-done').addEventListener('click', () => { openSettings(false); ui.input.focus(); });
ui.form.addEventListener('submit', (e) => e.preventDefault());
ui.form.addEventListener('input', (e) => {
  const t = e.target;
  if (t === ui.apiKey) {
    if (t.value) localStorage.setItem(API_KEY, t.value);
    else localStorage.removeItem(API_KEY);
  } else if (t.name) {
    current().settings[t.name] = t.type === 'checkbox' ? t.checked : t.value;
    save();
  }
});
ui.apiKey.addEventListener('change', () => { if (!model) loadModel(); });
$('save-defaults').addEventListener('click', (e) => {
  localStorage.setItem(DEFAULTS, JSON.stringify(current().settings));
  const b = e.currentTarget;
  b.textContent = 'Saved';
  setTimeout(() => { b.textContent = 'Use as defaults for new chats'; }, 1200);
});
$('reset-settings').addEventListener('click', () => {
  current().settings = defaults();
  save();
  fillSettings();
});
ui.messages.addEventListener('click', (e) => {
  const b = e.target.closest('.copy-code');
  if (b) copyText(b.closest('.code').querySelector('code').textContent, b);
});
document.addEventListener('keydown', (e) => {
  if (e.key !== 'Escape') return;
  if (!ui.settings.hidden) openSettings(false);
  if (document.body.classList.contains('sidebar-open')) openSidebar(false);
});

load();
renderAll();
loadModel();
ui.input.focus();
