/**
 * The call journal (decision 0024): a local, append-only file per instance in which every
 * forwarded call is written before its provider is called, and its outcome when its relay ends.
 * Admissions and settlements reach the database later, in group commits (decisions 0011, 0013);
 * what a killed process had not committed yet is found here at the next start (replay.ts).
 *
 * The file is a sequence of segments, one JSON line per entry. A segment is deleted once every
 * call it holds an entry of has its outcome committed (`done`) and a newer segment is being
 * written, so the journal holds about one segment plus the calls still in flight.
 */
import { closeSync, fsync, fsyncSync, mkdirSync, rmdirSync, openSync, readdirSync, readFileSync, unlinkSync, writeFileSync, writeSync, close } from 'node:fs';
import { join } from 'node:path';
import { systemClock, type Clock } from '../../domain/clock.ts';

/**
 * Segments are named for the clock's time, the process and a sequence, so a reader sees them in
 * about the order they were made; replay does not need any order (it gathers entries by call).
 */
const SEGMENT_SUFFIX = '.calls';
const LOCK_FILE = 'lock';
/** A segment is rotated past this size; kept small so an idle instance's journal stays small too. */
const DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024;
/**
 * How often what was written is flushed to the disk (fsync, off the event loop). A SIGKILL loses
 * nothing written (it is in the kernel's page cache once write() returned); a power loss or a kernel
 * crash may lose what was written since the last flush.
 */
const FLUSH_INTERVAL_MS = 1_000;

type Segment = { path: string; fd: number | null; bytes: number; open: number };

/** A call's place in the journal: the segments that hold its entries until it is done. */
export type JournalEntry = { id: string; segments: Segment[]; done: boolean };

/** Directories this process has open journals in (a lock naming this process's pid is then not stale). */
const openHere = new Set<string>();

export class CallJournal {
  readonly dir: string;
  /** Segments left by an earlier process in this directory, for replay.ts; deleted by `discard`. */
  readonly leftover: string[];
  readonly #segmentBytes: number;
  readonly #clock: Clock;
  #current: Segment;
  #sequence = 0;
  #dirty = false;
  #flusher: NodeJS.Timeout;
  #closed = false;

  /**
   * Opens the journal in `dir` (created if missing) for this process alone: a lock file names the
   * process; a directory whose lock names another live process is refused, since replaying or
   * deleting a live instance's segments would take over calls it is still serving.
   */
  constructor(dir: string, opts: { segmentBytes?: number; clock?: Clock } = {}) {
    this.dir = dir;
    this.#segmentBytes = opts.segmentBytes ?? DEFAULT_SEGMENT_BYTES;
    this.#clock = opts.clock ?? systemClock;
    mkdirSync(dir, { recursive: true });
    takeLock(dir);
    openHere.add(dir);
    this.leftover = segmentsIn(dir);
    this.#current = this.#newSegment();
    this.#flusher = setInterval(() => this.#flush(), FLUSH_INTERVAL_MS);
    this.#flusher.unref();
  }

  /** Writes a call's admission before its provider is called; the returned entry follows the call. */
  admitted(id: string, line: string): JournalEntry {
    const entry: JournalEntry = { id, segments: [], done: false };
    this.#append(entry, line);
    return entry;
  }

  /** Writes what a call's relay ended with (its usage, or that nothing is billed). */
  finished(entry: JournalEntry, line: string): void {
    if (!entry.done) this.#append(entry, line);
  }

  /** The call's outcome is committed to the database: its entries are no longer needed. */
  done(entry: JournalEntry): void {
    if (entry.done) return;
    entry.done = true;
    for (const segment of entry.segments) {
      segment.open--;
      if (segment.open === 0 && segment !== this.#current) this.#remove(segment);
    }
  }

  /** Deletes segments of an earlier process once replay.ts has put all they hold in the database. */
  discard(paths: readonly string[]): void {
    for (const path of paths) unlinkQuietly(path);
  }

  /**
   * Flushes and closes the journal. Segments still holding a call that is not done stay for the
   * next start's replay; the others are deleted (after a graceful stop, all of them).
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#flusher);
    const current = this.#current;
    if (current.fd !== null) {
      fsyncSync(current.fd);
      closeSync(current.fd);
      current.fd = null;
    }
    if (current.open === 0) unlinkQuietly(current.path);
    unlinkQuietly(join(this.dir, LOCK_FILE));
    openHere.delete(this.dir);
    // Empty after a graceful stop: nothing to keep (a default directory is named per database and port).
    try {
      rmdirSync(this.dir);
    } catch {
      // Segments of calls not done stay for the next start.
    }
  }

  #append(entry: JournalEntry, line: string): void {
    if (this.#current.bytes >= this.#segmentBytes) this.#rotate();
    const segment = this.#current;
    // Synchronous on purpose: once write() returns the entry is in the kernel, so a SIGKILL right
    // after (the provider call is made next) cannot lose it. One system call of ~1 KB.
    segment.bytes += writeSync(segment.fd!, line + '\n');
    this.#dirty = true;
    if (!entry.segments.includes(segment)) {
      entry.segments.push(segment);
      segment.open++;
    }
  }

  #rotate(): void {
    const previous = this.#current;
    this.#current = this.#newSegment();
    const fd = previous.fd!;
    previous.fd = null;
    // Nothing more is written to it: flushed and closed off the event loop.
    fsync(fd, () => close(fd, () => undefined));
    if (previous.open === 0) this.#remove(previous);
  }

  #newSegment(): Segment {
    // Created exclusively: a clock that stands still (a test's) or a reused pid could repeat a name,
    // and appending to a leftover segment would have it discarded with the calls it now holds.
    for (;;) {
      const name = `${this.#clock.now().toString(36).padStart(10, '0')}-${process.pid}-${String(this.#sequence++).padStart(6, '0')}${SEGMENT_SUFFIX}`;
      const path = join(this.dir, name);
      try {
        return { path, fd: openSync(path, 'ax'), bytes: 0, open: 0 };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
    }
  }

  #remove(segment: Segment): void {
    if (segment.fd !== null) {
      closeSync(segment.fd);
      segment.fd = null;
    }
    unlinkQuietly(segment.path);
  }

  #flush(): void {
    const fd = this.#current.fd;
    if (!this.#dirty || fd === null) return;
    this.#dirty = false;
    fsync(fd, () => undefined);
  }
}

/** The journal segments in `dir`, oldest first. */
export function segmentsIn(dir: string): string[] {
  return readdirSync(dir)
    .filter((name) => name.endsWith(SEGMENT_SUFFIX))
    .sort()
    .map((name) => join(dir, name));
}

/**
 * The lines of the segments, in order. A line cut short (a power loss in the middle of a write; a
 * SIGKILL cannot cut one) is skipped by the reader, so only whole entries are returned.
 */
export function readSegmentLines(paths: readonly string[]): string[] {
  return paths.flatMap((path) => readFileSync(path, 'utf8').split('\n').filter((line) => line !== ''));
}

function takeLock(dir: string): void {
  const lock = join(dir, LOCK_FILE);
  try {
    writeFileSync(lock, String(process.pid), { flag: 'wx' });
    return;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const holder = Number(readFileSync(lock, 'utf8'));
  if (holderIsAlive(dir, holder)) {
    throw new Error(`The call journal ${dir} is in use by process ${holder}: each instance needs its own CALL_JOURNAL_DIR.`);
  }
  // Left by a process that is gone (killed): its segments are this process's to replay.
  writeFileSync(lock, String(process.pid));
}

/**
 * Whether the process a lock names still runs. A container restarts with the same pid as the
 * process it replaces, so this process's own pid means "stale" unless it opened the journal itself.
 */
function holderIsAlive(dir: string, pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  if (pid === process.pid) return openHere.has(dir);
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function unlinkQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // Already gone.
  }
}
