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
/// - the handler sends each due work to a global queue, as `asyncAfter` did, so a timer's
///   work may set and cancel timers, and works due together still run side by side;
/// - a work is released after the lock (a cancel hands it back first): its release may
///   free a promise, whose last observers then run, and may cancel a timer.
///
/// A deadline already past fires at once (on a global queue, as any other). Works due at
/// the same moment are sent in the order their timers were set.
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

        fileprivate func isEarlier(than other: Entry) -> Bool {
            (deadline, order) < (other.deadline, other.order)
        }
    }

    private let source = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "Promise.timers"))
    private var entries: [Entry] = []  // a binary min-heap on (deadline, order)
    private var armedFor = DispatchTime.distantFuture  // when the source fires next; distantFuture: never
    private var setSoFar: UInt64 = 0

    private override init() {
        super.init()
        // `shared` is never freed: the handler may refer to it unowned.
        source.setEventHandler { [unowned self] in self.fireDue() }
        source.activate()
    }

    /// `work` runs on a global queue at `deadline` (at once if it has passed), unless
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

    /// The source's handler: takes every due work off the heap and arms the source for the
    /// next deadline, then sends the works to a global queue. The source may fire for a
    /// timer cancelled meanwhile: what is not due yet stays.
    private func fireDue() {
        let due: [@Sendable () -> Void] = withLock {
            armedFor = .distantFuture
            let now = DispatchTime.now()
            var due: [@Sendable () -> Void] = []
            while let first = entries.first, first.deadline <= now {
                remove(at: 0)
                if let work = first.work { due.append(work) }
                first.work = nil
            }
            if let first = entries.first { arm(at: first.deadline) }
            return due
        }
        for work in due { DispatchQueue.global().async(execute: work) }
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
    /// under a quarter is in use (never below a small floor, so a steady load does not
    /// reallocate back and forth).
    private func shrinkIfMostlyFree() {
        let floor = 1024
        guard entries.capacity > floor, entries.count < entries.capacity / 4 else { return }
        var smaller: [Entry] = []
        smaller.reserveCapacity(max(floor, entries.count * 2))
        smaller.append(contentsOf: entries)
        entries = smaller
    }
}
