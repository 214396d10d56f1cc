// A clock that moves only when a test says so, for the timers of `after`, `delay`,
// `timeout` and `retry`: tests of a 30-second timeout run in milliseconds.
import Foundation
import Promise

/// A `Clock` whose time stands still until `advance(by:)`. A sleeper on it wakes when the
/// clock reaches its deadline (at once if it has), or throws `CancellationError` when its
/// Task is cancelled. It also records every sleep asked of it, as durations from the time
/// they were asked, so a test can check a backoff's pauses.
final class ManualClock: Clock, @unchecked Sendable {
    struct Instant: InstantProtocol {
        var sinceStart: Duration

        func advanced(by duration: Duration) -> Instant { Instant(sinceStart: sinceStart + duration) }
        func duration(to other: Instant) -> Duration { other.sinceStart - sinceStart }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.sinceStart < rhs.sinceStart }
    }

    private struct Sleeper {
        let id: Int
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private let lock = NSLock()
    private var current = Instant(sinceStart: .zero)
    private var sleepers: [Sleeper] = []
    private var cancelledBeforeListed: Set<Int> = []
    private var nextID = 0
    private var asked: [Duration] = []

    var now: Instant { lock.withLock { current } }
    var minimumResolution: Duration { .zero }

    /// The sleepers waiting now.
    var sleeperCount: Int { lock.withLock { sleepers.count } }

    /// Every sleep asked so far, as the duration from `now` at the time to its deadline.
    var askedSleeps: [Duration] { lock.withLock { asked } }

    func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        let id = lock.withLock { () -> Int in
            nextID += 1
            return nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                lock.lock()
                asked.append(current.duration(to: deadline))
                if cancelledBeforeListed.remove(id) != nil {
                    lock.unlock()
                    continuation.resume(throwing: CancellationError())
                } else if deadline <= current {
                    lock.unlock()
                    continuation.resume()
                } else {
                    sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    lock.unlock()
                }
            }
        } onCancel: {
            lock.lock()
            if let index = sleepers.firstIndex(where: { $0.id == id }) {
                let sleeper = sleepers.remove(at: index)
                lock.unlock()
                sleeper.continuation.resume(throwing: CancellationError())
            } else {
                cancelledBeforeListed.insert(id)  // the continuation is not listed yet
                lock.unlock()
            }
        }
    }

    /// Moves the clock on by `duration`, waking every sleeper whose deadline it reaches.
    func advance(by duration: Duration) {
        let due: [Sleeper] = lock.withLock {
            current = current.advanced(by: duration)
            let due = sleepers.filter { $0.deadline <= current }
            sleepers.removeAll { $0.deadline <= current }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Waits (polling, bounded by the suite's timeout) until `count` sleepers wait.
    func waitForSleepers(_ count: Int) -> Bool {
        eventually { sleeperCount == count }
    }
}
