// Shared helpers for the behaviour tests: error values with identity, thread-safe
// recorders, a concurrency tracker, a thread-local "inside this call" marker, and a
// harness that starts racing threads together. Locks are fine here: these are tests.
import Dispatch
import Foundation
import Promise
import XCTest

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How long any single wait in the suite may take before the test fails instead of
/// hanging. Generous: sanitizer runs on two cores are slow.
let testTimeout: Duration = .seconds(10)
let testTimeoutSeconds: TimeInterval = 10

/// How many levels a million-level test builds: `levels`, or at most PROMISE_DEEP_LEVELS.
/// The sanitizer runs set it to 200,000 (mk/stress.mk): sanitized code takes a minute for
/// a million levels, and a release that recursed once per level would still overflow any
/// thread's stack at a fifth of them (the sanitizers' frames are larger, not smaller).
func deepLevels(_ levels: Int) -> Int {
    let cap = ProcessInfo.processInfo.environment["PROMISE_DEEP_LEVELS"].flatMap(Int.init) ?? levels
    return max(1, min(levels, cap))
}

/// An error with an identity, so a test can tell which error came through.
struct TestError: Error, Equatable, Sendable, CustomStringConvertible {
    let id: Int
    init(_ id: Int = 0) { self.id = id }
    var description: String { "TestError(\(id))" }
}

/// A second error type, for `mapError`.
struct WrappedError: Error, Sendable {
    let underlying: any Error
}

/// A thread-safe append-only list.
final class Recorder<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []

    func append(_ item: T) {
        lock.lock(); defer { lock.unlock() }
        items.append(item)
    }

    var values: [T] {
        lock.lock(); defer { lock.unlock() }
        return items
    }

    var count: Int { values.count }
}

/// A thread-safe counter.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0

    @discardableResult
    func increment(by amount: Int = 1) -> Int {
        lock.lock(); defer { lock.unlock() }
        count += amount
        return count
    }

    var value: Int {
        lock.lock(); defer { lock.unlock() }
        return count
    }
}

/// A thread-safe boolean.
final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var raised = false

    func set() {
        lock.lock(); defer { lock.unlock() }
        raised = true
    }

    var isSet: Bool {
        lock.lock(); defer { lock.unlock() }
        return raised
    }
}

/// A DispatchGroup that does not crash when counted down too often: a handler that runs
/// twice (a library bug) shows up as `overshoot`, a failed assertion, not a trap.
final class Countdown: @unchecked Sendable {
    private let condition = NSCondition()
    private var remaining: Int
    private var extra = 0

    init(_ count: Int = 0) { remaining = count }

    func add(_ count: Int = 1) {
        condition.lock(); defer { condition.unlock() }
        remaining += count
    }

    func countDown() {
        condition.lock(); defer { condition.unlock() }
        if remaining > 0 {
            remaining -= 1
            if remaining == 0 { condition.broadcast() }
        } else {
            extra += 1
        }
    }

    /// Waits until the count reaches zero; false on timeout.
    func wait(timeout: TimeInterval = testTimeoutSeconds) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        condition.lock(); defer { condition.unlock() }
        while remaining > 0 {
            if !condition.wait(until: deadline) { break }
        }
        return remaining == 0
    }

    /// How many count-downs arrived after the count had reached zero.
    var overshoot: Int {
        condition.lock(); defer { condition.unlock() }
        return extra
    }
}

/// Counts how many tracked sections run at the same time, and the most ever seen.
final class ConcurrencyTracker: @unchecked Sendable {
    private let lock = NSLock()
    private var active = 0
    private var peak = 0
    private var total = 0

    func enter() {
        lock.lock(); defer { lock.unlock() }
        active += 1
        total += 1
        peak = max(peak, active)
    }

    func leave() {
        lock.lock(); defer { lock.unlock() }
        active -= 1
    }

    /// Runs `body` as one tracked section, with a little busy work so that sections that
    /// are allowed to overlap actually get the chance to.
    func track(workMicroseconds: Int = 200, _ body: () -> Void = {}) {
        enter()
        busyWork(microseconds: workMicroseconds)
        body()
        leave()
    }

    var maxConcurrency: Int {
        lock.lock(); defer { lock.unlock() }
        return peak
    }

    var entries: Int {
        lock.lock(); defer { lock.unlock() }
        return total
    }
}

/// Spins (does not sleep) for about `microseconds`, so the thread stays busy on its core.
func busyWork(microseconds: Int) {
    let end = DispatchTime.now().uptimeNanoseconds + UInt64(microseconds) * 1_000
    var x: UInt64 = 0
    while DispatchTime.now().uptimeNanoseconds < end {
        x &+= 1
    }
    _ = x
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held. For
/// conditions that become true asynchronously with no event to wait on (a dispatched
/// block releasing its captures), never to give work "time to happen".
func eventually(timeout: TimeInterval = testTimeoutSeconds, _ condition: () -> Bool) -> Bool {
    let deadline = Date(timeIntervalSinceNow: timeout)
    while !condition() {
        if Date() > deadline { return false }
        usleep(1_000)
    }
    return true
}

// MARK: Thread-local markers

/// A marker set on the current thread while a call runs: a handler that sees it on its
/// own thread ran inside that call (synchronously, on the calling thread).
enum ThreadMarker {
    private static let key = "PromiseTests.ThreadMarker"

    /// Runs `body` with the marker `name` set on this thread.
    static func inside<T>(_ name: String, _ body: () throws -> T) rethrows -> T {
        let dictionary = Thread.current.threadDictionary
        let previous = dictionary[key]
        dictionary[key] = name
        defer { dictionary[key] = previous }
        return try body()
    }

    /// True if the current thread is inside `inside(name) { ... }`.
    static func isInside(_ name: String) -> Bool {
        (Thread.current.threadDictionary[key] as? String) == name
    }
}

// MARK: Racing threads

/// Runs `body(thread, round)` on `threads` dedicated threads for `rounds` rounds; in
/// each round every thread waits at a spinning barrier until all have arrived, so the
/// bodies of one round start together. Returns false if the threads did not finish in
/// time (a deadlock or a hang), true otherwise.
@discardableResult
func raceOnThreads(
    threads: Int, rounds: Int, timeout: TimeInterval = testTimeoutSeconds * 3,
    _ body: @escaping @Sendable (_ thread: Int, _ round: Int) -> Void
) -> Bool {
    let barrier = SpinBarrier(parties: threads)
    let finished = DispatchSemaphore(value: 0)
    for index in 0..<threads {
        let thread = Thread {
            for round in 0..<rounds {
                barrier.arriveAndWait(round: round)
                body(index, round)
            }
            finished.signal()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    let deadline = DispatchTime.now() + timeout
    for _ in 0..<threads {
        if finished.wait(timeout: deadline) == .timedOut { return false }
    }
    return true
}

/// A barrier for a fixed set of threads that passes round after round: arrivals are
/// counted monotonically, and round r opens once `parties * (r + 1)` have arrived.
/// Waiters spin (yielding the core) so they leave the barrier as close together as the
/// scheduler allows.
final class SpinBarrier: @unchecked Sendable {
    private let lock = NSLock()
    private var arrived = 0
    private let parties: Int

    init(parties: Int) { self.parties = parties }

    func arriveAndWait(round: Int) {
        lock.lock()
        arrived += 1
        lock.unlock()
        let target = parties * (round + 1)
        while true {
            lock.lock()
            let open = arrived >= target
            lock.unlock()
            if open { return }
            sched_yield()
        }
    }
}

// MARK: Reading outcomes

extension XCTestCase {
    /// The value of `promise` once settled (fails the test on error or timeout).
    func value<T>(_ promise: Promise<T>, file: StaticString = #filePath, line: UInt = #line) -> T? {
        do {
            return try promise.wait(timeout: testTimeout)
        } catch {
            XCTFail("expected a value, got \(error)", file: file, line: line)
            return nil
        }
    }

    /// The error of `promise` once settled (fails the test on a value or timeout).
    func error<T>(_ promise: Promise<T>, file: StaticString = #filePath, line: UInt = #line) -> (any Error)? {
        do {
            let v = try promise.wait(timeout: testTimeout)
            XCTFail("expected an error, got the value \(v)", file: file, line: line)
            return nil
        } catch PromiseError.timedOut {
            XCTFail("timed out waiting for the promise to settle", file: file, line: line)
            return nil
        } catch {
            return error
        }
    }

    /// Waits for `promise` to settle either way; fails the test on timeout.
    func settle<T>(_ promise: Promise<T>, file: StaticString = #filePath, line: UInt = #line) {
        do {
            _ = try promise.wait(timeout: testTimeout)
        } catch PromiseError.timedOut {
            XCTFail("timed out waiting for the promise to settle", file: file, line: line)
        } catch {}
    }

    /// Asserts that `promise` ends cancelled with `TestError(id)` as its reason.
    func assertCancelled<T>(_ promise: Promise<T>, reason id: Int,
                            file: StaticString = #filePath, line: UInt = #line) {
        let e = error(promise, file: file, line: line)
        XCTAssertEqual(e as? TestError, TestError(id), file: file, line: line)
        XCTAssertEqual(promise.state, .cancelled, file: file, line: line)
        XCTAssertTrue(promise.isCancelled, file: file, line: line)
        XCTAssertFalse(promise.isRejected, file: file, line: line)
    }
}

/// A user-defined context: counts its `execute` calls and forwards to a serial queue.
struct CountingContext: ExecutionContext {
    let calls = Counter()
    let queue = DispatchQueue(label: "PromiseTests.CountingContext")

    func execute(_ work: @escaping @Sendable () -> Void) {
        calls.increment()
        queue.async(execute: work)
    }
}

// MARK: Crash isolation

/// A LeakSanitizer suppression file for the XCTest harness (and Foundation's `Process`
/// bookkeeping) in child test processes; nil if it could not be written.
private let harnessLeakSuppressionsFile: String? = {
    let path = NSTemporaryDirectory() + "PromiseTests-lsan.supp"  // same content every run
    let rules = "leak:libXCTest.so\nleak:libFoundation.so\n"
    return FileManager.default.createFile(atPath: path, contents: Data(rules.utf8)) ? path : nil
}()

/// The environment variable that tells a child test process which test to run for real.
private let isolatedTestVariable = "PROMISE_TESTS_ISOLATED_TEST"

extension XCTestCase {
    fileprivate static var harnessLeakSuppressions: String? { harnessLeakSuppressionsFile }

    /// Runs `body` in a child process that runs only this test, so that a crash (a stack
    /// overflow in a stack-safety test) fails this one test, with the child's output,
    /// instead of killing the whole run. In the child, or where the test binary cannot
    /// re-run itself (Apple platforms run tests inside a host process), runs `body` here;
    /// also with PROMISE_TESTS_IN_PROCESS=1, which the sanitizer runs set: a sanitized
    /// child takes over a second to start, and a crash fails those runs all the same.
    func runInChildProcess(testName: String = #function,
                           file: StaticString = #filePath, line: UInt = #line,
                           _ body: () throws -> Void) rethrows {
        let name = testName.hasSuffix("()") ? String(testName.dropLast(2)) : testName
        let qualified = "PromiseTests.\(String(describing: type(of: self)))/\(name)"
        #if os(Linux)
        let ours = ProcessInfo.processInfo.environment
        let inChild = ours[isolatedTestVariable] == qualified || ours["PROMISE_TESTS_IN_PROCESS"] == "1"
        #else
        let inChild = true
        #endif
        if inChild {
            try body()
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe")
        process.arguments = [qualified]
        var environment = ProcessInfo.processInfo.environment
        environment[isolatedTestVariable] = qualified
        // Under --sanitize=address, LeakSanitizer checks the child at exit and finds the
        // XCTest harness's own objects (test-case instances, expectation bookkeeping)
        // still allocated; suppress those, and only those, so that a leak of the library
        // still fails the child.
        if let suppressions = Self.harnessLeakSuppressions {
            let options = environment["LSAN_OPTIONS"].map { $0 + ":" } ?? ""
            environment["LSAN_OPTIONS"] = options + "suppressions=\(suppressions)"
        }
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        do {
            try process.run()
        } catch {
            return XCTFail("could not start the child test process: \(error)", file: file, line: line)
        }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        let crashed = process.terminationReason == .uncaughtSignal
        if crashed || process.terminationStatus != 0 {
            // The child's own report (a failed assertion, a backtrace, sanitizer output).
            print("---- output of the child process for \(qualified) ----\n\(text)\n---- end ----")
            XCTFail(crashed ? "the test crashed with signal \(process.terminationStatus)"
                            : "the test failed in its child process (exit status \(process.terminationStatus))",
                    file: file, line: line)
        } else if !text.contains("Executed 1 test") {
            XCTFail("the child process did not run \(qualified):\n\(text)", file: file, line: line)
        }
    }
}

/// A serial queue held suspended, so handlers dispatched to it stay queued until `resume()`.
func heldQueue() -> DispatchQueue {
    let queue = DispatchQueue(label: "held")
    queue.suspend()
    return queue
}

/// Counts the `Payload`s alive: a value's lifetime, which no `weak` reference can show.
final class LifeTracker: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0

    func born() { lock.lock(); count += 1; lock.unlock() }
    func died() { lock.lock(); count -= 1; lock.unlock() }

    var alive: Int {
        lock.lock(); defer { lock.unlock() }
        return count
    }
}

/// A large value whose life `tracker` counts.
struct Payload: Sendable {
    let bytes: [UInt8]
    private let life: Life

    init(bytes: [UInt8], tracker: LifeTracker) {
        self.bytes = bytes
        self.life = Life(tracker)
    }

    private final class Life: Sendable {
        let tracker: LifeTracker
        init(_ tracker: LifeTracker) { self.tracker = tracker; tracker.born() }
        deinit { tracker.died() }
    }
}

/// A weak reference a `@Sendable` closure can fill in: to see when a promise made inside
/// a combinator's work is freed.
final class WeakPromise: @unchecked Sendable {
    weak var promise: AnyPromise?
}

/// A context that drops the `n`th piece of work it gets (releases it unrun) and runs the
/// rest on a serial queue: a later step of a run dropped.
final class DropsNth: ExecutionContext, @unchecked Sendable {
    let n: Int
    let count = Counter()
    let queue = DispatchQueue(label: "TestSupport.dropsNth")
    init(_ n: Int) { self.n = n }
    func execute(_ work: @escaping @Sendable () -> Void) {
        if count.increment() == n { return }
        queue.async(execute: work)
    }
}

/// A context that drops every piece of work unrun (a shut-down executor).
struct DroppingContext: ExecutionContext {
    func execute(_ work: @escaping @Sendable () -> Void) {}
}

/// A reference a test hands over to exactly one closure, which takes it and leaves nothing
/// behind (so that the object dies when that closure lets it go).
final class Handoff<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T?

    init(_ value: T?) { self.value = value }

    /// The value, still held here.
    var peek: T? { lock.withLock { value } }

    /// Holds `value` instead of what was held.
    func put(_ value: T?) { lock.withLock { self.value = value } }

    /// The value, no longer held here.
    func take() -> T? {
        lock.withLock {
            defer { value = nil }
            return value
        }
    }
}

// MARK: Outcomes that tell a rejection with PromiseError.timedOut from a wait that ran out

/// The outcome of `promise` once it settles, or nil if it does not within `timeout`.
/// Unlike `value(_:)` and `error(_:)`, a promise rejected with `PromiseError.timedOut`
/// reads as that failure, not as a wait that timed out.
func outcome<T>(_ promise: Promise<T>, timeout: TimeInterval = testTimeoutSeconds) -> Result<T, any Error>? {
    let box = Recorder<Result<T, any Error>>()
    let done = DispatchSemaphore(value: 0)
    promise.whenComplete(on: .immediate) { box.append($0); done.signal() }
    guard done.wait(timeout: .now() + timeout) == .success else { return nil }
    return box.values.first
}

/// The name of a `PromiseError`'s case, or nil for any other error.
func promiseErrorCase(_ error: (any Error)?) -> String? {
    guard let error = error as? PromiseError else { return nil }
    switch error {
    case .timedOut: return "timedOut"
    case .validationFailure: return "validationFailure"
    case .allRejected: return "allRejected"
    case .brokenPromise: return "brokenPromise"
    case .cycle: return "cycle"
    case .invalidArgument: return "invalidArgument"
    }
}

/// True if `result` is a failure with the same `PromiseError` case as `expected`.
func isPromiseError<T>(_ result: Result<T, any Error>?, _ expected: PromiseError) -> Bool {
    guard case .failure(let error)? = result else { return false }
    return promiseErrorCase(error) == promiseErrorCase(expected)
}

// MARK: Values that tell whether they were freed

/// A value whose memory tells whether it is still whole: a number and its complement,
/// overwritten by its deinit, so that reading it after it was freed (without a sanitizer)
/// is seen unless the memory was reused meanwhile; under AddressSanitizer the read itself
/// fails.
final class Sealed: @unchecked Sendable, CustomStringConvertible {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var count = 0

    private var number: Int
    private var check: Int
    private var state: UInt64

    init(_ number: Int) {
        self.number = number
        check = ~number
        state = 0x5EA1_ED5E_A1ED_0001
        Sealed.lock.withLock { Sealed.count += 1 }
    }

    deinit {
        state = 0xDEAD_DEAD_DEAD_DEAD
        number = -7
        check = -7
        Sealed.lock.withLock { Sealed.count -= 1 }
    }

    static var living: Int { lock.withLock { count } }

    /// The number if the value is whole, else nil.
    var intactNumber: Int? {
        guard state == 0x5EA1_ED5E_A1ED_0001, check == ~number else { return nil }
        return number
    }

    var description: String { "Sealed(\(number))" }
}

/// Records in `problems` unless `value` is there, whole, and `number`.
func expectWhole(_ value: Sealed?, _ number: Int, _ what: String, _ problems: Recorder<String>) {
    guard let value else { return problems.append("\(what): no value") }
    guard let read = value.intactNumber else { return problems.append("\(what): value not whole (freed?)") }
    if read != number { problems.append("\(what): read \(read), expected \(number)") }
}

// MARK: Promises a handler returns

/// A promise still pending when an `.immediate` handler returns it, which settles with
/// `value` later in the same cascade: the child of a root fulfilled here, whose handler
/// runs after the current one.
func settledLaterInTheCascade<T: Sendable>(with value: T) -> Promise<T> {
    let source = Promise<T>()
    let returned = source.then(on: .immediate) { $0 }
    source.fulfill(value)
    return returned
}

/// A promise locked in by `resolve(with:)` to a root then fulfilled with `value`.
func lockedInFollower<T: Sendable>(fulfilledWith value: T) -> Promise<T> {
    let follower = Promise<T>()
    let source = Promise<T>()
    follower.resolve(with: source)
    source.fulfill(value)
    return follower
}
