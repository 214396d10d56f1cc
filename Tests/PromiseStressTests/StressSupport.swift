// Shared machinery of the stress suite: a crew of threads that start each round on a
// spinning barrier, probes that record every handler run, outcome and error tags that
// compare by value, the contexts handlers run on, and resident-set sampling. Locks are
// fine here (tests); the library itself takes none.
import Dispatch
import Foundation
import Promise
import Synchronization
import XCTest

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// MARK: Errors, outcomes, what a handler saw

/// An error with an identity: resolvers and cancellers each use their own ids, so an
/// outcome names the call that produced it.
struct StressError: Error, Equatable, Sendable {
    let id: Int
}

extension Error {
    /// The id of a `StressError`, -1 for any other error.
    var stressID: Int { (self as? StressError)?.id ?? -1 }
}

/// An error reduced to something `Equatable`.
enum ErrorTag: Equatable, Sendable, CustomStringConvertible {
    case stress(Int)
    case validation
    case timedOut
    case allRejected([ErrorTag])
    case cancellation
    case brokenPromise
    case other(String)

    init(_ error: any Error) {
        switch error {
        case let error as StressError: self = .stress(error.id)
        case PromiseError.validationFailure: self = .validation
        case PromiseError.timedOut: self = .timedOut
        case PromiseError.allRejected(let errors): self = .allRejected(errors.map(ErrorTag.init))
        case is CancellationError: self = .cancellation
        case PromiseError.brokenPromise: self = .brokenPromise
        default: self = .other(String(describing: error))
        }
    }

    var description: String {
        switch self {
        case .stress(let id): return "E\(id)"
        case .validation: return "validationFailure"
        case .timedOut: return "timedOut"
        case .allRejected(let tags): return "allRejected(\(tags))"
        case .cancellation: return "CancellationError"
        case .brokenPromise: return "brokenPromise"
        case .other(let text): return text
        }
    }
}

/// The final state of a promise of any value type, by value (`value` maps the fulfilled
/// value to something comparable).
enum Final<T: Equatable & Sendable>: Equatable, Sendable, CustomStringConvertible {
    case pending
    case fulfilled(T)
    case rejected(ErrorTag)
    case cancelled(ErrorTag)

    /// Reads a settled promise without blocking (`wait` returns at once once settled).
    init<V>(_ promise: Promise<V>, _ value: (V) -> T) {
        let state = promise.state
        guard state != .pending else {
            self = .pending
            return
        }
        do {
            self = .fulfilled(value(try promise.wait()))
        } catch {
            self = state == .cancelled ? .cancelled(ErrorTag(error)) : .rejected(ErrorTag(error))
        }
    }

    var isPending: Bool { self == .pending }

    var description: String {
        switch self {
        case .pending: return "pending"
        case .fulfilled(let v): return "fulfilled(\(v))"
        case .rejected(let tag): return "rejected(\(tag))"
        case .cancelled(let tag): return "cancelled(\(tag))"
        }
    }
}

/// The settled state of a `Promise<Int>`, by value.
typealias Settled = Final<Int>

extension Final where T == Int {
    init(_ promise: Promise<Int>) {
        self.init(promise, { $0 })
    }
}

/// What a handler was handed.
enum Seen: Equatable, Sendable, CustomStringConvertible {
    case value(Int)
    case error(ErrorTag)
    case nothing

    init(_ result: Result<Int, any Error>) {
        switch result {
        case .success(let v): self = .value(v)
        case .failure(let e): self = .error(ErrorTag(e))
        }
    }

    var description: String {
        switch self {
        case .value(let v): return "value \(v)"
        case .error(let tag): return "error \(tag)"
        case .nothing: return "(no argument)"
        }
    }
}

// MARK: Recording handler runs

/// A value behind a lock. NSLock (a pthread mutex), not `Synchronization.Mutex`: TSan
/// intercepts pthread mutexes, while `Mutex`'s contended path runs inside the
/// uninstrumented standard library, so TSan misses its ordering and reports false races.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) {
        self.value = value
    }

    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// Violations found after a round was checked (a handler that ran late, twice, or with
/// the wrong argument); checked every round and at the end of each test.
final class ViolationLog: Sendable {
    private let entries = Locked<(count: Int, first: [String])>((0, []))

    func add(_ text: String) {
        entries.withLock { log in
            log.count += 1
            if log.first.count < 10 { log.first.append(text) }
        }
    }

    var count: Int { entries.withLock { $0.count } }
    var first: [String] { entries.withLock { $0.first } }
}

/// Records each run of one handler: how often, what it saw, where it ran. Once the
/// round is checked the probe is sealed with what may still happen (nothing, or one run
/// with a known argument); a later run that breaks the seal goes to the violation log.
final class Probe: Sendable {
    struct Record: Sendable {
        var runs = 0
        var seen: Seen?
        /// The crew seat of the thread the first run was on; nil off the crew.
        var seat: Int?
        var onMainThread = false
        /// A sequence number taken at the first run (for ordering checks).
        var sequence = 0
        var seal: Seal?
    }

    struct Seal: Sendable {
        let maxRuns: Int
        let expected: Seen?
        let label: String
    }

    private static let clock = Atomic<Int>(0)
    private let record = Locked(Record())
    let log: ViolationLog

    init(log: ViolationLog) {
        self.log = log
    }

    func hit(_ seen: Seen) {
        let seat = Seat.current
        let onMain = Thread.isMainThread
        let sequence = Probe.clock.add(1, ordering: .relaxed).newValue
        let problem: String? = record.withLock { record in
            record.runs += 1
            if record.runs == 1 {
                record.seen = seen
                record.seat = seat
                record.onMainThread = onMain
                record.sequence = sequence
            }
            guard let seal = record.seal else { return nil }
            if record.runs > seal.maxRuns {
                return "\(seal.label): ran \(record.runs) times after its round was checked (at most \(seal.maxRuns))"
            }
            if let expected = seal.expected, expected != seen {
                return "\(seal.label): ran late with \(seen), expected \(expected)"
            }
            return nil
        }
        if let problem { log.add(problem) }
    }

    /// A fresh number from the sequence probes stamp their first run with.
    static func tick() -> Int {
        clock.add(1, ordering: .relaxed).newValue
    }

    var snapshot: Record { record.withLock { $0 } }
    var runs: Int { record.withLock { $0.runs } }

    /// From now on at most `maxRuns` runs in all, with `expected` as the argument.
    func seal(maxRuns: Int, expected: Seen?, label: String) {
        record.withLock { $0.seal = Seal(maxRuns: maxRuns, expected: expected, label: label) }
    }
}

// MARK: Threads

/// Which crew seat the current thread is (nil for any other thread), via a pthread key.
enum Seat {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0)
        return key
    }()

    static func set(_ seat: Int) {
        precondition(pthread_setspecific(key, UnsafeRawPointer(bitPattern: seat + 1)) == 0)
    }

    static var current: Int? {
        guard let pointer = pthread_getspecific(key) else { return nil }
        return Int(bitPattern: pointer) - 1
    }
}

/// A barrier that passes round after round: the last of `parties` to arrive opens it;
/// the others spin (and, after a while, yield: two cores, more threads) so that they
/// leave it as close together as the scheduler allows.
final class SpinBarrier: Sendable {
    private let parties: Int
    private let arrived = Atomic<Int>(0)
    private let phase = Atomic<Int>(0)

    init(parties: Int) {
        self.parties = parties
    }

    func arriveAndWait() {
        let myPhase = phase.load(ordering: .acquiring)
        if arrived.add(1, ordering: .acquiringAndReleasing).newValue == parties {
            arrived.store(0, ordering: .relaxed)
            phase.add(1, ordering: .releasing)
            return
        }
        // Spin without yielding for a while (~0.2 ms): threads that are on a core when
        // the barrier opens leave it together. Yielding at once would let the scheduler
        // run them one after another (two cores, more threads, other load), and rounds
        // would rarely collide. After that, yield so that late threads get a core.
        let spinUntil = DispatchTime.now().uptimeNanoseconds + SpinBarrier.spinNanoseconds
        var spins = 0
        var yielding = false
        while phase.load(ordering: .acquiring) == myPhase {
            spins &+= 1
            guard spins & 63 == 0 else { continue }
            if yielding {
                sched_yield()
            } else {
                yielding = DispatchTime.now().uptimeNanoseconds > spinUntil
            }
        }
    }

    static let spinNanoseconds: UInt64 = 200_000
}

private let spinSink = Atomic<Int>(0)

/// Busy-waits about `iterations` steps: shifts when a thread acts inside a round.
func spin(_ iterations: Int) {
    var i = 0
    while i < iterations {
        _ = spinSink.load(ordering: .relaxed)
        i += 1
    }
}

/// A fixed set of threads (seats) that play rounds: `play` hands every seat the same job,
/// which typically starts with `barrier.arriveAndWait()`, and returns once all are done.
/// The condition variable gives the main thread a happens-before edge to everything the
/// seats wrote, so checks read their results without further synchronisation.
final class Crew: @unchecked Sendable {
    let size: Int
    let barrier: SpinBarrier
    private let condition = NSCondition()
    private var generation = 0
    private var done = 0
    private var exited = 0
    private var stopping = false
    private var job: (@Sendable (Int) -> Void)?

    init(size: Int) {
        self.size = size
        barrier = SpinBarrier(parties: size)
        for seat in 0..<size {
            let thread = Thread { [self] in self.work(seat: seat) }
            thread.name = "stress seat \(seat)"
            thread.start()
        }
    }

    private func work(seat: Int) {
        Seat.set(seat)
        var seen = 0
        condition.lock()
        while true {
            while generation == seen && !stopping { condition.wait() }
            if stopping {
                exited += 1
                condition.broadcast()
                condition.unlock()
                return
            }
            seen = generation
            let job = self.job.unsafelyUnwrapped
            condition.unlock()
            job(seat)
            condition.lock()
            done += 1
            if done == size { condition.broadcast() }
        }
    }

    /// Runs `job(seat)` on every seat at once; false if they did not all finish within
    /// `timeout` (a hang: the crew is then unusable).
    func play(timeout: TimeInterval = StressConfiguration.roundTimeout,
              _ job: @escaping @Sendable (_ seat: Int) -> Void) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        self.job = job
        done = 0
        generation += 1
        condition.broadcast()
        let deadline = Date(timeIntervalSinceNow: timeout)
        while done < size {
            if !condition.wait(until: deadline) && done < size { return false }
        }
        self.job = nil
        return true
    }

    /// Lets the threads exit (waits a little for them; a hung crew is left behind).
    func stop() {
        condition.lock()
        defer { condition.unlock() }
        stopping = true
        condition.broadcast()
        let deadline = Date(timeIntervalSinceNow: 5)
        while exited < size {
            if !condition.wait(until: deadline) { return }
        }
    }
}

/// One slot per seat for what that seat produced in a round: each seat writes only its
/// own box, the main thread reads them all after `Crew.play` returned.
final class SeatBox<T>: @unchecked Sendable {
    var items: [T] = []
}

/// A small deterministic generator (SplitMix64): rounds are reproducible by number.
struct StressRandom {
    private var state: UInt64

    init(round: Int, seat: Int, salt: UInt64 = 0) {
        state = UInt64(truncatingIfNeeded: round) &* 0x9E37_79B9_7F4A_7C15
            ^ UInt64(truncatingIfNeeded: seat &+ 1) &* 0xBF58_476D_1CE4_E5B9 ^ salt
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func below(_ bound: Int) -> Int {
        Int(next() % UInt64(max(bound, 1)))
    }
}

// MARK: Contexts

/// A user-defined context: forwards to a global queue.
struct ForwardingContext: ExecutionContext {
    func execute(_ work: @escaping @Sendable () -> Void) {
        DispatchQueue.global().async(execute: work)
    }
}

/// Every kind of context the library supports.
enum ContextKind: Int, CaseIterable, Sendable, CustomStringConvertible {
    case immediate, standard, main, serial, barrier, concurrent, operations, custom

    static let serialQueue = DispatchQueue(label: "PromiseStressTests.serial")
    static let concurrentQueue = DispatchQueue(label: "PromiseStressTests.concurrent", attributes: .concurrent)
    #if Foundation  // the package trait, on by default
    static let operationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 2
        return queue
    }()
    #else
    // Without the trait: a queue of the same width in its place.
    static let operationQueue = DispatchQueue(label: "PromiseStressTests.operations", attributes: .concurrent)
    #endif

    var context: any ExecutionContext {
        switch self {
        case .immediate: return .immediate
        case .standard: return .default
        case .main: return .main
        case .serial: return ContextKind.serialQueue
        case .barrier: return ContextKind.concurrentQueue
        case .concurrent: return .concurrent(ContextKind.concurrentQueue)
        case .operations: return ContextKind.operationQueue
        case .custom: return ForwardingContext()
        }
    }

    var description: String {
        switch self {
        case .immediate: return ".immediate"
        case .standard: return ".default"
        case .main: return ".main"
        case .serial: return "serial queue"
        case .barrier: return "concurrent queue (barrier)"
        case .concurrent: return ".concurrent(queue)"
        case .operations: return "OperationQueue"
        case .custom: return "custom context"
        }
    }
}

/// Polls `condition` on the main thread, running the main run loop meanwhile (so `.main`
/// handlers get to run), until it holds or `timeout` passes.
func pumpMainRunLoop(timeout: TimeInterval = StressConfiguration.roundTimeout,
                     until condition: () -> Bool) -> Bool {
    let deadline = Date(timeIntervalSinceNow: timeout)
    while !condition() {
        if Date() >= deadline { return false }
        _ = RunLoop.current.run(mode: .default, before: Date(timeIntervalSinceNow: 0.0002))
    }
    return true
}

/// Lets queued work finish: every queue the suite uses drains, then the main run loop
/// runs a little (for `.main` and `.default` handlers, which have no queue to sync on).
func drainContexts() {
    ContextKind.serialQueue.sync {}
    ContextKind.concurrentQueue.sync(flags: .barrier) {}
    #if Foundation
    ContextKind.operationQueue.waitUntilAllOperationsAreFinished()
    #else
    ContextKind.operationQueue.sync(flags: .barrier) {}
    #endif
    _ = pumpMainRunLoop(timeout: 0.05) { false }
}

// MARK: Memory

/// The resident set of this process in bytes, from /proc/self/statm (nil elsewhere).
func residentSetBytes() -> Int? {
    #if os(Linux)
    let fd = open("/proc/self/statm", O_RDONLY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 256)
    let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
    guard count > 0 else { return nil }
    let fields = String(decoding: buffer[0..<count], as: UTF8.self).split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    #else
    return nil
    #endif
}

/// A value that counts its live instances: a promise that leaks keeps its token alive.
final class LiveToken: Sendable {
    static let live = Atomic<Int>(0)
    let id: Int

    init(_ id: Int) {
        self.id = id
        LiveToken.live.add(1, ordering: .relaxed)
    }

    deinit {
        LiveToken.live.subtract(1, ordering: .releasing)
    }

    static var count: Int { live.load(ordering: .acquiring) }
}
