/** Small formatters and DOM helpers shared by the panel, the job view and the status item. */

/** A share of time, 0..1, as a whole percentage. */
export function percent(share: number): string {
  return `${Math.round(share * 100)}%`;
}

export function formatCount(n: number): string {
  return n.toLocaleString('en-US');
}

export function formatDuration(ms: number): string {
  if (ms < 0 || !isFinite(ms)) {
    return '-';
  }
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (h) {
    return `${h}h ${m}m ${sec}s`;
  }
  return m ? `${m}m ${sec}s` : ms < 10000 ? `${(ms / 1000).toFixed(1)}s` : `${sec}s`;
}

/** A latency: milliseconds below a second, else as a duration. */
export function formatLatency(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)} ms` : formatDuration(ms);
}

export function formatBytes(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function formatTime(epochMs: number): string {
  return epochMs > 0 ? new Date(epochMs).toLocaleTimeString() : '-';
}

/** An element with a class and optional text; data attributes go through `dataset` by the caller. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Sets text only when it changed, so an unchanged refresh touches no DOM. */
export function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

export function setData(node: HTMLElement, key: string, value: string): void {
  if (node.dataset[key] !== value) {
    node.dataset[key] = value;
  }
}

/**
 * Keeps `container`'s children in step with `items`, one child per key: existing children are
 * updated in place (a refresh must not replace a button between a press and its release, nor
 * close what the user opened), new ones created, gone ones removed, order as in `items`.
 */
export function syncChildren<T>(
  container: HTMLElement,
  items: T[],
  key: (item: T) => string,
  create: (item: T) => HTMLElement,
  update: (node: HTMLElement, item: T) => void
): void {
  const existing = new Map<string, HTMLElement>();
  for (const child of Array.from(container.children) as HTMLElement[]) {
    if (child.dataset.key !== undefined) {
      existing.set(child.dataset.key, child);
    }
  }
  let previous: Element | null = null;
  for (const item of items) {
    const k = key(item);
    let node = existing.get(k);
    if (node) {
      existing.delete(k);
    } else {
      node = create(item);
      node.dataset.key = k;
    }
    update(node, item);
    const wanted: Element | null = previous ? previous.nextElementSibling : container.firstElementChild;
    if (wanted !== node) {
      container.insertBefore(node, wanted);
    }
    previous = node;
  }
  existing.forEach(node => node.remove());
}
