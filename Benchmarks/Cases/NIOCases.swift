// The SwiftNIO baselines of the cases in Cases.swift, each array appended to ours there.
// Behind the package trait NIOBaselines (on by default): `make bench-check`, which reads only
// our promise's mallocs and bytes, builds without it, and so without SwiftNIO.
#if NIOBaselines
import NIOCore
import NIOPosix
import Promise

/// The event loop every NIO baseline runs on: one thread of its own.
public enum Loops {
    public static let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    public static let nio: any EventLoop = group.next()

    /// Runs `body` on the loop and waits for it (one hop per batch, not per operation).
    public static func onLoop(_ body: @escaping @Sendable () -> Void) {
        try! nio.submit(body).wait()
    }

    /// Returns once every task submitted to the loop before this call has run.
    public static func drain() {
        try! nio.submit {}.wait()
    }
}

let nioSettleOne: [Case] = [
    Case("settle-one", "nio", ops: settleOneOps, .sync {
        Loops.onLoop {
            let loop = Loops.nio
            for i in 0..<settleOneOps {
                let p = loop.makePromise(of: Int.self)
                p.futureResult.whenSuccess { sink($0) }
                p.succeed(i)
            }
        }
    }),
]

let nioChain: [Case] = [
    Case("chain-1000", "nio", ops: chainLength * chainsPerRun, .sync {
        Loops.onLoop {
            for _ in 0..<chainsPerRun {
                let root = Loops.nio.makePromise(of: Int.self)
                var tail = root.futureResult
                for _ in 0..<chainLength {
                    tail = tail.map { $0 + 1 }
                }
                root.succeed(0)
                sink(tail)
            }
        }
    }),
]

let nioFanOut: [Case] = [
    Case("fan-out-1000", "nio", ops: fanOutWidth * fanOutsPerRun, .sync {
        Loops.onLoop {
            for _ in 0..<fanOutsPerRun {
                let p = Loops.nio.makePromise(of: Int.self)
                for _ in 0..<fanOutWidth {
                    p.futureResult.whenSuccess { sink($0) }
                }
                p.succeed(1)
            }
        }
    }),
]

let nioContended: [Case] = [
    Case("contended", "nio-off-loop", ops: 3 * contendedPromises, .prepared {
        let promises = (0..<contendedPromises).map { _ in Loops.nio.makePromise(of: Int.self) }
        return {
            let register: @Sendable () -> Void = {
                for p in promises { p.futureResult.whenSuccess { sink($0) } }
            }
            ThreeThreads.shared.run(register, register) {
                for (i, p) in promises.enumerated() { p.succeed(i) }
            }
            Loops.drain()  // the loop runs the callbacks: wait until it has
        }
    }),
]

let nioObserveSettled: [Case] = [
    Case("observe-settled:then", "nio", ops: observeOps, .sync {
        Loops.onLoop {
            let f = Loops.nio.makeSucceededFuture(1)
            for _ in 0..<observeOps {
                sink(f.map { $0 + 1 })
            }
        }
    }),
    Case("observe-settled:whenComplete", "nio", ops: observeOps, .sync {
        Loops.onLoop {
            let f = Loops.nio.makeSucceededFuture(1)
            for _ in 0..<observeOps {
                f.whenSuccess { sink($0) }
            }
        }
    }),
]

let nioTimeoutAnswered: [Case] = [
    Case("timeout:answered", "nio", ops: timeoutOps, .sync {
        Loops.onLoop {
            let loop = Loops.nio
            for i in 0..<timeoutOps {
                let request = loop.makePromise(of: Int.self)
                let timer = loop.scheduleTask(in: .seconds(30)) { request.fail(BenchTimedOut()) }
                request.futureResult.whenComplete { _ in timer.cancel() }
                request.succeed(i)
                sink(request.futureResult)
            }
        }
    }),
]

let nioAllocations: [Case] = [
    Case("alloc:Promise()", "nio", ops: allocOps, .sync {
        Loops.onLoop {
            for _ in 0..<allocOps {
                // (NIO's leak check, which wants every promise completed, is debug-only.)
                escape(Loops.nio.makePromise(of: Int.self).futureResult)
            }
        }
    }),
    Case("alloc:then", "nio", ops: allocOps, .sync {
        Loops.onLoop {
            let p = Loops.nio.makePromise(of: Int.self)
            for _ in 0..<allocOps { sink(p.futureResult.map { $0 + 1 }) }
            p.succeed(1)
        }
    }),
    Case("alloc:then-1-ref", "nio", ops: allocOps, .sync {
        Loops.onLoop {
            let p = Loops.nio.makePromise(of: Int.self)
            let box = Box()
            for _ in 0..<allocOps { sink(p.futureResult.map { $0 + box.value }) }
            p.succeed(1)
        }
    }),
    Case("alloc:then-2-captures", "nio", ops: allocOps, .sync {
        Loops.onLoop {
            let p = Loops.nio.makePromise(of: Int.self)
            let box = Box()
            for i in 0..<allocOps { sink(p.futureResult.map { $0 + box.value + i }) }
            p.succeed(1)
        }
    }),
    Case("alloc:whenComplete", "nio", ops: allocOps, .sync {
        Loops.onLoop {
            let p = Loops.nio.makePromise(of: Int.self)
            for _ in 0..<allocOps { p.futureResult.whenComplete { sink($0) } }
            p.succeed(1)
        }
    }),
    Case("alloc:all-8-inputs", "nio", ops: allInputs * allRounds, .prepared {
        let inputs = (0..<allRounds).map { _ in (0..<allInputs).map { _ in Loops.nio.makePromise(of: Int.self) } }
        return {
            Loops.onLoop {
                for round in inputs {
                    let all = EventLoopFuture.whenAllSucceed(round.map(\.futureResult), on: Loops.nio)
                    for (i, p) in round.enumerated() { p.succeed(i) }
                    sink(all)
                }
            }
        }
    }),
]
#else
let nioSettleOne: [Case] = []
let nioChain: [Case] = []
let nioFanOut: [Case] = []
let nioContended: [Case] = []
let nioObserveSettled: [Case] = []
let nioTimeoutAnswered: [Case] = []
let nioAllocations: [Case] = []
#endif
