import Dispatch

/// The library's Dispatch timers (`after`, `delay`, `timeout`, `retry`'s pauses without a
/// `clock:`): one min-heap of deadlines, and one `DispatchSourceTimer` armed for the
/// earliest of them.
///
/// Why not one `DispatchQueue.asyncAfter` per timer: Dispatch cannot take a scheduled
/// block back. A cancelled `DispatchWorkItem` stays in Dispatch's own timer heap, with its
/// block, until its deadline, and then wakes a thread to find nothing to do. A server that
/// sets a 30-second `timeout` on every request, most of them answered in milliseconds,
/// kept about 600 bytes for each request of the last 30 seconds that way, and spent a
/// fifth of its samples in Dispatch's timer threads. Here a cancel takes its entry off the
/// heap at once, with what the work captured: nothing of a cancelled timer stays. The
/// heap's own array shrinks again once most of it is free, so a burst of timers does not
/// keep its peak either.
///
/// A spin lock (`SpinLocked`) guards the heap, held for one heap operation and, when the
/// earliest deadline changes, the source's re-arming; callers take it on their own thread
/// (timers are not on the hot paths of registering, settling and firing, and a cancel is
/// one short critical section: Dispatch's `sync` cost ten times as many instructions, a
/// block copy included). The source's handler runs on a queue of its own and takes the
/// same lock. Two rules keep user code out of the critical section, where a call back
/// into the heap would wait on itself:
///
/// - the handler sends each due work to one of the library's timer lanes (`send`), so a
///   timer's work may set and cancel timers, and works due together run side by side;
/// - a work is released after the lock (a cancel hands it back first): its release may
///   free a promise, whose last observers then run, and may cancel a timer.
///
/// A deadline already past fires at once (on a lane, as any other). Works due at the same
/// moment are sent in the order their timers were set.
///
/// Why lanes of our own, not Dispatch's global queues (where `asyncAfter` runs its blocks):
/// a process whose global pool is saturated (blocking I/O on global queues, `wait()` in
/// many `.default` handlers) would run its timeouts only once a thread of that pool came
/// free, seconds late or never, which is when a timeout matters most. A lane is a serial
/// queue, and Dispatch gives a serial queue a thread even when the global pool is busy
/// (serial queues overcommit). A work goes to the lane with the fewest works sent to it
/// and not yet finished, so works due together run side by side, as on a global queue,
/// with at most `laneCount` threads. A lane whose work has run for longer than
/// `stuckAfter` (a work that blocks: an `.immediate` handler, which must not) gets no
/// more while another lane is not stuck, and on a tie the lane whose work started last
/// (or has not started) wins: a blocked handler delays the timers due after it only once
/// every lane is busy. (Works sent together, before any of them starts, cannot know which
/// will block: one may land behind it.) A lane holds no thread while it has nothing to
/// run.
final class TimerHeap: SpinLocked, @unchecked Sendable {  // the stored properties under the lock, `source` aside
    /// The process's heap, made on first use. It lives as long as the process.
    static let shared = TimerHeap()

    /// One timer on the heap, the handle its `cancel` needs. Its fields are read and
    /// written under the heap's lock only.
    final class Entry: @unchecked Sendable {
        fileprivate let deadline: DispatchTime
        fileprivate var order: UInt64 = 0 // ties between equal deadlines: first set, first run
        fileprivate var index: Int        // place in `entries`; -1 once off the heap
        fileprivate var work: (@Sendable () -> Void)?

        fileprivate init(deadline: DispatchTime, work: @escaping @Sendable () -> Void) {
            self.deadline = deadline
            self.index = -1
            self.work = work
        }

        /// Runs the work of an entry the handler took off the heap, on a lane, and
        /// lets go of it there. Only this touches `work` once the entry is off the heap
        /// (`index` -1: a cancel does nothing then).
        fileprivate func run() {
            let work = self.work
            self.work = nil
            work?()
        }

        fileprivate func isEarlier(than other: Entry) -> Bool {
            (deadline, order) < (other.deadline, other.order)
        }
    }

    /// Where due works run: see the type's comment.
    private static let laneCount = 8
    private static let lanes = (0..<laneCount).map { DispatchQueue(label: "Promise.timers.lane\($0)") }
    /// A work running longer than this holds its lane: it is taken for blocked.
    private static let stuckAfter: UInt64 = 10_000_000  // nanoseconds
    /// Per lane, under the lock: the works sent to it and not finished yet, and when the
    /// one running now started (uptime nanoseconds; 0 if none runs).
    private var laneLoads = [Int](repeating: 0, count: TimerHeap.laneCount)
    private var laneRunningSince = [UInt64](repeating: 0, count: TimerHeap.laneCount)

    /// Runs `work` on the lane with the fewest works sent and not finished, among those
    /// not stuck (all of them if every one is); on a tie, the one whose running work
    /// started last, or that runs none yet (a work that started long ago may be blocked).
    /// Counts it there until it returns.
    func send(_ work: @escaping @Sendable () -> Void) {
        let lane = withLock {
            // Read under the lock, after every start recorded before it: none is later.
            let now = DispatchTime.now().uptimeNanoseconds
            // Smaller is better, in order: not stuck, fewer works, a later start (or none).
            func rank(_ lane: Int) -> (Int, Int, UInt64) {
                let since = laneRunningSince[lane]
                let stuck = since != 0 && now &- since >= TimerHeap.stuckAfter
                return (stuck ? 1 : 0, laneLoads[lane], since == 0 ? 0 : .max - since)
            }
            var chosen = 0
            for index in 1..<TimerHeap.laneCount where rank(index) < rank(chosen) { chosen = index }
            laneLoads[chosen] += 1
            return chosen
        }
        TimerHeap.lanes[lane].async {
            self.withLock { self.laneRunningSince[lane] = max(DispatchTime.now().uptimeNanoseconds, 1) }
            work()
            self.withLock {
                self.laneLoads[lane] -= 1
                self.laneRunningSince[lane] = 0
            }
        }
    }

    private let source = DispatchSource.makeTimerSource(queue: TimerHeap.queue)
    /// The queue the source's handler runs on; `queueKey` marks it (for tests: no work is
    /// released there).
    private static let queue = DispatchQueue(label: "Promise.timers")
    static let queueKey = DispatchSpecificKey<Bool>()
    /// How many due entries the handler takes off per hold of the lock: a burst of timers
    /// due together keeps cancels and new timers waiting for at most this many.
    private static let fireBatch = 128
    private var entries: [Entry] = []  // a binary min-heap on (deadline, order)
    private var armedFor = DispatchTime.distantFuture  // when the source fires next; distantFuture: never
    private var setSoFar: UInt64 = 0

    private override init() {
        super.init()
        TimerHeap.queue.setSpecific(key: TimerHeap.queueKey, value: true)
        // `shared` is never freed: the handler may refer to it unowned.
        source.setEventHandler { [unowned self] in self.fireDue() }
        source.activate()
    }

    /// `work` runs on a lane at `deadline` (at once if it has passed), unless
    /// `cancel` takes the returned entry off the heap first.
    func schedule(at deadline: DispatchTime, _ work: @escaping @Sendable () -> Void) -> Entry {
        let entry = Entry(deadline: deadline, work: work)
        withLock {
            entry.order = setSoFar
            setSoFar &+= 1
            insert(entry)
            if entry.deadline < armedFor { arm(at: entry.deadline) }
        }
        return entry
    }

    /// Takes `entry` off the heap and lets go of its work, unless it has fired: then this
    /// does nothing (its work runs or has run, exactly once). Thread-safe.
    ///
    /// - Returns: whether it took the entry off, so that the work will never run.
    @discardableResult
    func cancel(_ entry: Entry) -> Bool {
        let work: (@Sendable () -> Void)?? = withLock {
            guard entry.index >= 0 else { return nil }
            remove(at: entry.index)
            defer { entry.work = nil }
            return .some(entry.work)
        }
        return work != nil  // the last reference to the work goes here, after the lock
    }

    /// How many timers wait on the heap (for tests).
    var count: Int { withLock { entries.count } }

    /// The heap array's capacity (for tests: it shrinks after a burst).
    var capacity: Int { withLock { entries.capacity } }

    /// How many times the array was shrunk (for tests: not on every remove).
    private(set) var shrinks = 0

    /// The source's handler: takes the due entries off the heap, a batch per hold of the
    /// lock, and sends each to a lane, which runs its work and lets go of it there
    /// (dropping the last reference here would run a deinit on this queue); the last batch
    /// arms the source for the next deadline. The source may fire for a timer cancelled
    /// meanwhile: what is not due yet stays.
    private func fireDue() {
        var lastBatch = false
        while !lastBatch {
            var batch: [Entry] = []
            withLock {
                let now = DispatchTime.now()
                while batch.count < TimerHeap.fireBatch, let first = entries.first, first.deadline <= now {
                    remove(at: 0)
                    batch.append(first)
                }
                guard batch.count < TimerHeap.fireBatch else { return }
                lastBatch = true
                if let first = entries.first { arm(at: first.deadline) } else { armedFor = .distantFuture }
            }
            for entry in batch { send { entry.run() } }
        }
    }

    // MARK: Under the lock

    private func arm(at deadline: DispatchTime) {
        armedFor = deadline
        source.schedule(deadline: deadline)
    }

    private func insert(_ entry: Entry) {
        entry.index = entries.count
        entries.append(entry)
        siftUp(entry.index)
    }

    /// Takes the entry at `index` off the heap: the last entry fills its place and moves
    /// up or down to where it belongs.
    private func remove(at index: Int) {
        let removed = entries[index]
        let last = entries.removeLast()
        removed.index = -1
        if index < entries.count {
            entries[index] = last
            last.index = index
            siftUp(index)
            siftDown(last.index)
        }
        shrinkIfMostlyFree()
    }

    private func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard entries[child].isEarlier(than: entries[parent]) else { return }
            swapAt(child, parent)
            child = parent
        }
    }

    private func siftDown(_ start: Int) {
        var parent = start
        while true {
            var earliest = parent
            let left = 2 * parent + 1, right = left + 1
            if left < entries.count && entries[left].isEarlier(than: entries[earliest]) { earliest = left }
            if right < entries.count && entries[right].isEarlier(than: entries[earliest]) { earliest = right }
            guard earliest != parent else { return }
            swapAt(parent, earliest)
            parent = earliest
        }
    }

    private func swapAt(_ i: Int, _ j: Int) {
        entries.swapAt(i, j)
        entries[i].index = i
        entries[j].index = j
    }

    /// After a burst the array would keep its peak capacity: give most of it back once
    /// under a quarter is in use. Never below a floor, and only from twice the floor (malloc
    /// rounds the capacity up: a shrunk array must not qualify again), so a steady load does
    /// not reallocate back and forth.
    private func shrinkIfMostlyFree() {
        let floor = 1024
        guard entries.capacity > 2 * floor, entries.count < entries.capacity / 4 else { return }
        var smaller: [Entry] = []
        smaller.reserveCapacity(max(floor, entries.count * 2))
        smaller.append(contentsOf: entries)
        entries = smaller
        shrinks += 1
    }
}
