// Small DOM helpers: element creation and keyed list updates that keep focus.

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * h creates an element. attrs: class, text, dataset entries as data-*, on*
 * handlers as functions, anything else as an attribute. Children may be
 * strings, nodes, arrays or null.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  return fill(el, attrs, children);
}

/** s creates an SVG element, like h. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  return fill(el, attrs, children);
}

function fill(el, attrs, children) {
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'text') el.textContent = v;
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else el.setAttribute(k === 'className' ? 'class' : k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** replace replaces el's children, skipping null and false. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** setText sets an element's text only when it changed, to spare layout. */
export function setText(el, text) {
  text = String(text);
  if (el.textContent !== text) el.textContent = text;
}

/**
 * syncList makes parent's children match items, by key: existing elements
 * are updated in place (so focus and hover survive a refresh), new ones are
 * created, missing ones removed, and the order follows items.
 */
export function syncList(parent, items, key, create, update) {
  const old = new Map();
  for (const el of Array.from(parent.children)) {
    if (el.dataset.key != null) old.set(el.dataset.key, el);
  }
  let prev = null;
  for (const item of items) {
    const k = String(key(item));
    let el = old.get(k);
    if (el) old.delete(k);
    else {
      el = create(item);
      el.dataset.key = k;
    }
    update(el, item);
    const want = prev ? prev.nextSibling : parent.firstChild;
    if (want !== el) parent.insertBefore(el, want);
    prev = el;
  }
  for (const el of old.values()) el.remove();
}
