import Dispatch
import Foundation
import Promise

/// An error of the consumer's own, to see it come out the other end unchanged.
struct Failure: Error, Equatable {
    let code: Int
}

/// A reason for `cancel(reason:)`.
struct UserAborted: Error {}

/// A value that handlers on other threads update; guarded by a lock.
final class Locked<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) {
        self.value = value
    }

    var current: Value {
        lock.lock()
        defer { lock.unlock() }
        return value
    }

    @discardableResult
    func update<R>(_ body: (inout Value) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}

/// A consumer-defined execution context: a one-thread event loop, the way a server
/// framework would plug its own executor into the library.
final class EventLoop: ExecutionContext, @unchecked Sendable {
    private let condition = NSCondition()
    private var queue: [@Sendable () -> Void] = []
    private var submitted = 0
    private var loopThread: Thread?

    init(name: String) {
        let thread = Thread { [self] in self.run() }
        thread.name = name
        thread.start()
    }

    /// ExecutionContext: queue `work`; it runs later, on the loop's thread.
    func execute(_ work: @escaping @Sendable () -> Void) {
        condition.lock()
        queue.append(work)
        submitted += 1
        condition.signal()
        condition.unlock()
    }

    /// True on the loop's own thread.
    var inLoop: Bool {
        condition.lock()
        defer { condition.unlock() }
        return loopThread === Thread.current
    }

    /// How many times `execute` was called.
    var executeCalls: Int {
        condition.lock()
        defer { condition.unlock() }
        return submitted
    }

    private func run() {
        condition.lock()
        loopThread = Thread.current
        condition.unlock()
        while true {
            condition.lock()
            while queue.isEmpty { condition.wait() }
            let work = queue.removeFirst()
            condition.unlock()
            work()
        }
    }
}

/// Tells whether code runs on the main queue, through a queue-specific value.
final class MainQueueMarker: @unchecked Sendable {
    static let shared = MainQueueMarker()
    private let key = DispatchSpecificKey<Bool>()

    func mark() {
        DispatchQueue.main.setSpecific(key: key, value: true)
    }

    var onMainQueue: Bool {
        DispatchQueue.getSpecific(key: key) ?? false
    }
}

/// Counts and prints checks; the program exits non-zero if any failed.
@MainActor
final class Report {
    private(set) var passed = 0
    private(set) var failed = 0
    private var section = ""

    func begin(_ name: String) {
        section = name
        print("\n== \(name)")
    }

    func check(_ condition: Bool, _ what: String, _ detail: @autoclosure () -> String = "") {
        if condition {
            passed += 1
            print("  ok    \(what)")
        } else {
            failed += 1
            let extra = detail()
            print("  FAIL  \(what)\(extra.isEmpty ? "" : " (\(extra))")  [\(section)]")
        }
    }

    /// Awaits `promise` and checks that it fulfilled with `expected`.
    func expect<T: Sendable & Equatable>(_ promise: Promise<T>, _ expected: T, _ what: String) async {
        let result = await promise.result
        switch result {
        case .success(let value):
            check(value == expected, what, "got \(value), expected \(expected)")
        case .failure(let error):
            check(false, what, "rejected with \(error), expected \(expected)")
        }
    }

    /// Awaits `promise` and checks that it failed with an error `matches` accepts.
    func expectFailure<T: Sendable>(
        _ promise: Promise<T>, _ what: String, _ matches: (any Error) -> Bool
    ) async {
        switch await promise.result {
        case .success(let value):
            check(false, what, "fulfilled with \(value), expected an error")
        case .failure(let error):
            check(matches(error), what, "failed with \(error)")
        }
    }
}

/// A completion-handler API of the `Result` shape, for `Promise.wrap`.
func legacyResult(_ value: Int, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
    DispatchQueue.global().async { completion(.success(value)) }
}

/// A completion-handler API of the Objective-C shape `(value?, error?)`.
func legacyOptional(_ value: Int?, completion: @escaping @Sendable (Int?, (any Error)?) -> Void) {
    DispatchQueue.global().async {
        if let value { completion(value, nil) } else { completion(nil, Failure(code: 404)) }
    }
}

/// A completion-handler API that only ever reports a value.
func legacyValue(_ value: String, completion: @escaping @Sendable (String) -> Void) {
    DispatchQueue.global().async { completion(value) }
}
