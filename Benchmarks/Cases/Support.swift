import Dispatch
import Foundation

/// Keeps a value alive as far as the optimiser knows, at the cost of one call.
@inline(never)
public func sink<T>(_ value: T) {
    _ = value
}

nonisolated(unsafe) private var escaped: AnyObject?

/// Makes `object` escape (it stays alive until the next call), as a real promise does: a
/// promise that provably never escapes could be put on the stack by the optimiser.
@inline(never)
public func escape(_ object: AnyObject) {
    escaped = object
}

/// Serial queues for the queue-hop and async-bridge cases.
public enum Queues {
    public static let serial = DispatchQueue(label: "bench.serial")
    public static let settler = DispatchQueue(label: "bench.settler")
}

/// A class instance for closures that capture one reference.
public final class Box: @unchecked Sendable {
    public var value = 1
    public init() {}
}

/// Three long-lived worker threads started per round: the contended case's two
/// registering threads and its settling thread. Starting and joining a round costs a few
/// semaphore operations, amortised over thousands of promises.
public final class ThreeThreads: @unchecked Sendable {
    private var jobs: [@Sendable () -> Void] = []
    private let start = (0..<3).map { _ in DispatchSemaphore(value: 0) }
    private let done = DispatchSemaphore(value: 0)

    public init() {
        for index in 0..<3 {
            let thread = Thread { [self] in
                while true {
                    start[index].wait()
                    jobs[index]()
                    done.signal()
                }
            }
            thread.start()
        }
    }

    /// Runs the three jobs at once, one per thread, and returns when all three did.
    public func run(_ first: @escaping @Sendable () -> Void,
                    _ second: @escaping @Sendable () -> Void,
                    _ third: @escaping @Sendable () -> Void) {
        jobs = [first, second, third]
        for semaphore in start { semaphore.signal() }
        for _ in 0..<3 { done.wait() }
    }

    public static let shared = ThreeThreads()
}
