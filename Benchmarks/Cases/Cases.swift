import Dispatch
import Promise

/// One measured body: `ops` operations of `name` (the case) done by `impl` (our promise or a
/// baseline). The benchmark target turns each into a package-benchmark `Benchmark`, the
/// profiling tool runs one in a loop under callgrind: both read this list.
public struct Case: Sendable {
    public enum Body: Sendable {
        /// Runs `ops` operations.
        case sync(@Sendable () -> Void)
        /// Runs `ops` operations in an async context.
        case async(@Sendable () async -> Void)
        /// Builds the inputs (not measured), then returns the measured part.
        case prepared(@Sendable () -> @Sendable () -> Void)
    }

    public let name: String
    public let impl: String
    /// Operations per run of `body`; the report divides by it.
    public let ops: Int
    public let body: Body

    public init(_ name: String, _ impl: String, ops: Int, _ body: Body) {
        self.name = name
        self.impl = impl
        self.ops = ops
        self.body = body
    }

    public var id: String { "\(name)/\(impl)" }

    /// True for cases whose inputs are built outside the measurement.
    public var isPrepared: Bool {
        if case .prepared = body { return true }
        return false
    }

    /// Runs the body `rounds` times, outside package-benchmark (the profiling tool). Async
    /// bodies run in one Task while this thread waits: callgrind copes badly with an async
    /// main.
    ///
    /// With `prepareOnly`, a prepared case builds and drops its inputs without running the
    /// measured part, so that a profile can subtract what package-benchmark does not measure.
    public func run(rounds: Int, prepareOnly: Bool = false) {
        switch body {
        case .sync(let run):
            for _ in 0..<rounds { run() }
        case .prepared(let prepare):
            for _ in 0..<rounds {
                let measured = prepare()
                if !prepareOnly { measured() }
            }
        case .async(let run):
            let done = DispatchSemaphore(value: 0)
            Task {
                for _ in 0..<rounds { await run() }
                done.signal()
            }
            done.wait()
        }
    }
}

// MARK: The cases

/// Every case and baseline, in report order.
public let allCases: [Case] = settleOne + chain + fanOut + contended + observeSettled
    + queueHop + asyncBridge + timeoutAnswered + allocations

// 1. settle-one: a pending promise, one observer, fulfilled.
let settleOneOps = 10_000

let settleOne: [Case] = [
    Case("settle-one", "promise", ops: settleOneOps, .sync {
        for i in 0..<settleOneOps {
            let p = Promise<Int>()
            p.whenComplete(on: .immediate) { sink($0) }
            p.fulfill(i)
        }
    }),
    Case("settle-one", "lock", ops: settleOneOps, .sync {
        for i in 0..<settleOneOps {
            let p = LockPromise<Int>.make()
            p.whenComplete { sink($0) }
            p.fulfill(i)
        }
    }),
    Case("settle-one", "continuation", ops: settleOneOps, .async {
        for i in 0..<settleOneOps {
            let v = await withUnsafeContinuation { $0.resume(returning: i) }
            sink(v)
        }
    }),
] + nioSettleOne

// 2. chain-1000: a 1000-step map chain built on a pending promise, then settled; per step.
let chainLength = 1000
let chainsPerRun = 10

let chain: [Case] = [
    Case("chain-1000", "promise", ops: chainLength * chainsPerRun, .sync {
        for _ in 0..<chainsPerRun {
            let root = Promise<Int>()
            var tail = root
            for _ in 0..<chainLength {
                tail = tail.then(on: .immediate) { $0 + 1 }
            }
            root.fulfill(0)
            sink(tail)
        }
    }),
] + nioChain

// 3. fan-out-1000: one promise, 1000 observers, settled; per observer.
let fanOutWidth = 1000
let fanOutsPerRun = 10

let fanOut: [Case] = [
    Case("fan-out-1000", "promise", ops: fanOutWidth * fanOutsPerRun, .sync {
        for _ in 0..<fanOutsPerRun {
            let p = Promise<Int>()
            for _ in 0..<fanOutWidth {
                p.whenComplete(on: .immediate) { sink($0) }
            }
            p.fulfill(1)
        }
    }),
    Case("fan-out-1000", "lock", ops: fanOutWidth * fanOutsPerRun, .sync {
        for _ in 0..<fanOutsPerRun {
            let p = LockPromise<Int>.make()
            for _ in 0..<fanOutWidth {
                p.whenComplete { sink($0) }
            }
            p.fulfill(1)
        }
    }),
] + nioFanOut

// 4. contended: two threads register observers on the same pending promises while a
// third settles them. An operation is one registration or one settle (3 per promise).
let contendedPromises = 4096

let contended: [Case] = [
    Case("contended", "promise", ops: 3 * contendedPromises, .prepared {
        let promises = (0..<contendedPromises).map { _ in Promise<Int>() }
        return {
            let register: @Sendable () -> Void = {
                for p in promises { p.whenComplete(on: .immediate) { sink($0) } }
            }
            ThreeThreads.shared.run(register, register) {
                for (i, p) in promises.enumerated() { p.fulfill(i) }
            }
        }
    }),
    Case("contended", "lock", ops: 3 * contendedPromises, .prepared {
        let promises = (0..<contendedPromises).map { _ in LockPromise<Int>.make() }
        return {
            let register: @Sendable () -> Void = {
                for p in promises { p.whenComplete { sink($0) } }
            }
            ThreeThreads.shared.run(register, register) {
                for (i, p) in promises.enumerated() { p.fulfill(i) }
            }
        }
    }),
] + nioContended

// 4b. observe-settled: a continuation registered on an already fulfilled promise.
let observeOps = 10_000

let observeSettled: [Case] = [
    Case("observe-settled:then", "promise", ops: observeOps, .sync {
        let p = Promise(value: 1)
        for _ in 0..<observeOps {
            sink(p.then(on: .immediate) { $0 + 1 })
        }
    }),
    Case("observe-settled:whenComplete", "promise", ops: observeOps, .sync {
        let p = Promise(value: 1)
        for _ in 0..<observeOps {
            p.whenComplete(on: .immediate) { sink($0) }
        }
    }),
    Case("observe-settled:whenComplete", "lock", ops: observeOps, .sync {
        let p = LockPromise<Int>.make()
        p.fulfill(1)
        for _ in 0..<observeOps {
            p.whenComplete { sink($0) }
        }
    }),
] + nioObserveSettled

// 5. queue-hop: then(on: serialQueue) end to end (create, register, fulfil, the handler
// runs on the queue) against a bare queue.async of the same work.
let hopOps = 2_000

let queueHop: [Case] = [
    Case("queue-hop", "promise", ops: hopOps, .sync {
        let queue = Queues.serial
        for i in 0..<hopOps {
            let p = Promise<Int>()
            p.then(on: queue) { sink($0) }
            p.fulfill(i)
        }
        queue.sync {}  // FIFO: every handler has run
    }),
    Case("queue-hop", "queue.async", ops: hopOps, .sync {
        let queue = Queues.serial
        for i in 0..<hopOps {
            queue.async { sink(i) }
        }
        queue.sync {}
    }),
]

// 6. async-bridge: `try await p.value` against withUnsafeContinuation.
let bridgeSettledOps = 10_000
let bridgePendingOps = 1_000

let asyncBridge: [Case] = [
    Case("async-bridge:settled", "promise", ops: bridgeSettledOps, .async {
        let p = Promise(value: 1)
        for _ in 0..<bridgeSettledOps {
            sink(try! await p.value)
        }
    }),
    Case("async-bridge:settled", "continuation", ops: bridgeSettledOps, .async {
        for i in 0..<bridgeSettledOps {
            sink(await withUnsafeContinuation { $0.resume(returning: i) })
        }
    }),
    Case("async-bridge:pending", "promise", ops: bridgePendingOps, .async {
        let settler = Queues.settler
        for i in 0..<bridgePendingOps {
            let p = Promise<Int>()
            settler.async { p.fulfill(i) }
            sink(try! await p.value)
        }
    }),
    Case("async-bridge:pending", "continuation", ops: bridgePendingOps, .async {
        let settler = Queues.settler
        for i in 0..<bridgePendingOps {
            sink(await withUnsafeContinuation { c in settler.async { c.resume(returning: i) } })
        }
    }),
]

// 7. timeout:answered: a request's 30-second timeout, set and then cancelled because the
// answer came first (a server's everyday case), against NIO's own idiom on its loop: a
// scheduled task that would fail the promise, cancelled when the promise completes.
let timeoutOps = 5_000

struct BenchTimedOut: Error {}

let timeoutAnswered: [Case] = [
    Case("timeout:answered", "promise", ops: timeoutOps, .sync {
        for i in 0..<timeoutOps {
            let request = Promise<Int>()
            let answer = request.timeout(.seconds(30))
            request.fulfill(i)
            sink(answer)
        }
    }),
] + nioTimeoutAnswered

// 8. allocations: what one call costs in mallocs (times are printed too).
let allocOps = 10_000
let allInputs = 8
let allRounds = 1_000

let allocations: [Case] = [
    Case("alloc:Promise()", "promise", ops: allocOps, .sync {
        for _ in 0..<allocOps { escape(Promise<Int>()) }
    }),
    Case("alloc:Promise()", "lock", ops: allocOps, .sync {
        for _ in 0..<allocOps { escape(LockPromise<Int>.make()) }
    }),
    // then, closure capturing nothing: registered on a pending promise, which then settles.
    Case("alloc:then", "promise", ops: allocOps, .sync {
        let p = Promise<Int>()
        for _ in 0..<allocOps { p.then(on: .immediate) { $0 + 1 } }
        p.fulfill(1)
    }),
    // then, closure capturing one reference.
    Case("alloc:then-1-ref", "promise", ops: allocOps, .sync {
        let p = Promise<Int>()
        let box = Box()
        for _ in 0..<allocOps { p.then(on: .immediate) { $0 + box.value } }
        p.fulfill(1)
    }),
    // then, closure capturing two values (a context allocation of its own).
    Case("alloc:then-2-captures", "promise", ops: allocOps, .sync {
        let p = Promise<Int>()
        let box = Box()
        for i in 0..<allocOps { p.then(on: .immediate) { $0 + box.value + i } }
        p.fulfill(1)
    }),
    Case("alloc:whenComplete", "promise", ops: allocOps, .sync {
        let p = Promise<Int>()
        for _ in 0..<allocOps { p.whenComplete(on: .immediate) { sink($0) } }
        p.fulfill(1)
    }),
    Case("alloc:whenComplete", "lock", ops: allocOps, .sync {
        let p = LockPromise<Int>.make()
        for _ in 0..<allocOps { p.whenComplete { sink($0) } }
        p.fulfill(1)
    }),
    // whenComplete, closure capturing one reference (its context is that object: no
    // allocation of its own, and none for the library to add, such as a reabstraction
    // thunk around the closure).
    Case("alloc:whenComplete-1-ref", "promise", ops: allocOps, .sync {
        let p = Promise<Int>()
        let box = Box()
        for _ in 0..<allocOps { p.whenComplete(on: .immediate) { sink($0.map { $0 + box.value }) } }
        p.fulfill(1)
    }),
    Case("alloc:whenComplete-1-ref", "lock", ops: allocOps, .sync {
        let p = LockPromise<Int>.make()
        let box = Box()
        for _ in 0..<allocOps { p.whenComplete { sink($0 + box.value) } }
        p.fulfill(1)
    }),
    // all: per input, for 8 inputs (created before the measurement), then settled.
    Case("alloc:all-8-inputs", "promise", ops: allInputs * allRounds, .prepared {
        let inputs = (0..<allRounds).map { _ in (0..<allInputs).map { _ in Promise<Int>() } }
        return {
            for round in inputs {
                let all = Promise.all(round)
                for (i, p) in round.enumerated() { p.fulfill(i) }
                sink(all)
            }
        }
    }),
] + nioAllocations
