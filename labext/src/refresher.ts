/**
 * Runs an async refresh repeatedly while started: one at a time (a slow server never gets a
 * second request stacked on the first), and the starts at least `intervalMs` apart.
 */
export class Refresher {
  constructor(
    private readonly refresh: () => Promise<void>,
    private readonly intervalMs: number
  ) {}

  get running(): boolean {
    return this._running;
  }

  start(): void {
    if (this._running) {
      return;
    }
    this._running = true;
    this._schedule(Math.max(0, this._lastStart + this.intervalMs - Date.now()));
  }

  stop(): void {
    this._running = false;
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  /** A refresh soon (after an action), still no sooner than the interval allows. */
  poke(): void {
    if (this._running && this._timer !== null && !this._busy) {
      clearTimeout(this._timer);
      this._schedule(Math.max(0, this._lastStart + this.intervalMs - Date.now()));
    }
  }

  private _schedule(delay: number): void {
    this._timer = setTimeout(() => void this._tick(), delay);
  }

  private async _tick(): Promise<void> {
    this._timer = null;
    if (!this._running || this._busy) {
      return;
    }
    this._busy = true;
    this._lastStart = Date.now();
    try {
      await this.refresh();
    } catch (error) {
      console.warn('streamlab: refresh failed', error);
    } finally {
      this._busy = false;
    }
    if (this._running && this._timer === null) {
      this._schedule(Math.max(0, this._lastStart + this.intervalMs - Date.now()));
    }
  }

  private _running = false;
  private _busy = false;
  private _lastStart = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
