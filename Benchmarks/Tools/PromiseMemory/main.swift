// Bytes per held promise, ours beside SwiftNIO's EventLoopFuture, in one process: what
// `make bench` reports and `make bench-check` gates (Benchmarks/README.md, "Memory").
//
//   PromiseMemory [--json]
//
// Each case builds `count` items and holds them all, reading glibc's count of bytes in use
// (mallinfo2: chunks with their headers, in one arena for every thread) before and after:
// the difference over `count` is what one item costs, malloc's rounding and headers
// included. Deterministic for a given binary and libc, unlike the resident set or time.
// The retention case reports the bytes a held settled leaf keeps instead (not per item).
// NIO's rows need the package trait NIOBaselines (on by default; `make bench-check`, which
// gates ours only, builds without it).
import CMallocInfo
import Foundation
#if NIOBaselines
import NIOCore
import NIOPosix
#endif
import Promise

cmi_use_one_arena()  // before any thread starts: the loop's allocations must be counted too

let count = 100_000
let chainLength = 100_000
let rootValueBytes = 50_000_000

struct Row: Encodable {
    let `case`: String
    let impl: String
    let bytes: Double
    let perItem: Bool
}

func bytesInUse() -> Int {
    let bytes = cmi_malloc_bytes_in_use()
    guard bytes >= 0 else {
        FileHandle.standardError.write("PromiseMemory: mallinfo2 is not available here (glibc only)\n".data(using: .utf8)!)
        exit(2)
    }
    return bytes
}

/// Bytes per item of `build`, whose items `hold` keeps until `release`.
func perItem<Item>(_ build: () -> Item, release: ([Item]) -> Void) -> Double {
    var items: [Item] = []
    items.reserveCapacity(count)
    let before = bytesInUse()
    for _ in 0..<count { items.append(build()) }
    let after = bytesInUse()
    release(items)
    return Double(after - before) / Double(count)
}

#if NIOBaselines
let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let loop = group.next()

/// Runs `body` on the loop and returns its result (NIO's callbacks are registered there).
func onLoop<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
    try! loop.submit(body).wait()
}
#endif

struct Held<T>: @unchecked Sendable { var value: T }

var rows: [Row] = []

// A pending root.
rows.append(Row(case: "mem:root", impl: "promise", bytes: perItem({ Promise<Int>() }) { roots in
    for root in roots { root.fulfill(0) }
}, perItem: true))
#if NIOBaselines
rows.append(Row(case: "mem:root", impl: "nio", bytes: onLoop {
    Held(value: perItem({ loop.makePromise(of: Int.self) }) { promises in
        for promise in promises { promise.succeed(0) }
    })
}.value, perItem: true))
#endif

// A pending root with two observers.
rows.append(Row(case: "mem:root+2-observers", impl: "promise", bytes: perItem({ () -> Promise<Int> in
    let root = Promise<Int>()
    root.whenComplete(on: .immediate) { _ in }
    root.whenComplete(on: .immediate) { _ in }
    return root
}) { roots in
    for root in roots { root.fulfill(0) }
}, perItem: true))
#if NIOBaselines
// NIO's futures have no context to choose: one measurement serves both rows.
let nioTwoObservers = onLoop {
    Held(value: perItem({ () -> EventLoopPromise<Int> in
        let promise = loop.makePromise(of: Int.self)
        promise.futureResult.whenComplete { _ in }
        promise.futureResult.whenComplete { _ in }
        return promise
    }) { promises in
        for promise in promises { promise.succeed(0) }
    })
}.value
rows.append(Row(case: "mem:root+2-observers", impl: "nio", bytes: nioTwoObservers, perItem: true))
#endif

// The same with both observers on `.default`, what `whenComplete` without `on:` makes: the
// first in the root's own slot, the second in a box. They run on the default queue once
// the roots are fulfilled, freeing what they held; so that this happens before the next
// case is measured, the release waits until every one of them has run (they count
// themselves in a global: the closures capture nothing and allocate nothing). The last
// few may still be returning as the next case starts: a few hundred bytes in all, not
// per item.
final class RunCount: @unchecked Sendable {
    private let lock = NSLock()
    private var runs = 0
    func add() { lock.withLock { runs += 1 } }
    var value: Int { lock.withLock { runs } }

    /// Waits until `expected` runs were counted since the last reset, then resets.
    func awaitRuns(_ expected: Int) {
        let deadline = Date().addingTimeInterval(60)
        while value < expected {
            precondition(Date() < deadline, "PromiseMemory: .default handlers did not all run within 60 s")
            usleep(100)
        }
        lock.withLock { runs = 0 }
    }
}
let defaultRuns = RunCount()
rows.append(Row(case: "mem:root+2-observers-default", impl: "promise", bytes: perItem({ () -> Promise<Int> in
    let root = Promise<Int>()
    root.whenComplete { _ in defaultRuns.add() }
    root.whenComplete { _ in defaultRuns.add() }
    return root
}) { roots in
    for root in roots { root.fulfill(0) }
    defaultRuns.awaitRuns(2 * roots.count)
}, perItem: true))
#if NIOBaselines
rows.append(Row(case: "mem:root+2-observers-default", impl: "nio", bytes: nioTwoObservers, perItem: true))
#endif

// A pending root and one child, both held.
rows.append(Row(case: "mem:root+then", impl: "promise", bytes: perItem({ () -> (Promise<Int>, Promise<Int>) in
    let root = Promise<Int>()
    return (root, root.then(on: .immediate) { $0 + 1 })
}) { pairs in
    for (root, _) in pairs { root.fulfill(0) }
}, perItem: true))
#if NIOBaselines
let nioMapChild = onLoop {
    Held(value: perItem({ () -> (EventLoopPromise<Int>, EventLoopFuture<Int>) in
        let promise = loop.makePromise(of: Int.self)
        return (promise, promise.futureResult.map { $0 + 1 })
    }) { pairs in
        for (promise, _) in pairs { promise.succeed(0) }
    })
}.value
rows.append(Row(case: "mem:root+then", impl: "nio", bytes: nioMapChild, perItem: true))
#endif

// The same with the child on `.default`, what a `then` without `on:` makes.
rows.append(Row(case: "mem:root+then-default", impl: "promise", bytes: perItem({ () -> (Promise<Int>, Promise<Int>) in
    let root = Promise<Int>()
    return (root, root.then { value -> Int in
        defaultRuns.add()  // on the default queue, after the fulfil below (see the observers row)
        return value + 1
    })
}) { pairs in
    for (root, _) in pairs { root.fulfill(0) }
    defaultRuns.awaitRuns(pairs.count)
}, perItem: true))
#if NIOBaselines
rows.append(Row(case: "mem:root+then-default", impl: "nio", bytes: nioMapChild, perItem: true))
#endif

// What a settled race keeps while its other input stays pending: `race([work, shutdown])` in
// a loop, each `work` settled at once, nothing but `shutdown` held. Per race, over `count`
// races: 0 means constant memory. NIO has no race; its closest form is a callback on each
// input completing a fresh promise, the usual way to write one.
func keptPerSettledRace(_ race: () -> Void) -> Double {
    let before = bytesInUse()
    for _ in 0..<count { race() }
    let after = bytesInUse()
    return Double(after - before) / Double(count)
}

do {
    let shutdown = Promise<Int>()
    rows.append(Row(case: "mem:settled-race-on-pending-input", impl: "promise", bytes: keptPerSettledRace {
        let work = Promise<Int>()
        let race = Promise.race([work, shutdown])
        work.fulfill(1)
        precondition(race.isFulfilled)
    }, perItem: true))
    shutdown.fulfill(0)
}
#if NIOBaselines
rows.append(Row(case: "mem:settled-race-on-pending-input", impl: "nio", bytes: onLoop {
    final class Once: @unchecked Sendable { var done = false }
    let shutdown = loop.makePromise(of: Int.self)
    let kept = keptPerSettledRace {
        let work = loop.makePromise(of: Int.self)
        let race = loop.makePromise(of: Int.self)
        let once = Once()
        for input in [work, shutdown] {
            input.futureResult.whenComplete { result in
                guard !once.done else { return }
                once.done = true
                race.completeWith(result)
            }
        }
        work.succeed(1)
    }
    shutdown.succeed(0)
    return kept
}, perItem: true))
#endif

// What a held settled leaf keeps: a chain of `.immediate` steps from a root fulfilled with a
// large value; only the leaf is held once the chain settled.
func keptByLeaf<Leaf>(_ build: () -> Leaf, _ read: (Leaf) -> Int) -> Double {
    let before = bytesInUse()
    let leaf = build()
    let after = bytesInUse()
    precondition(read(leaf) == rootValueBytes + chainLength, "the chain computed \(read(leaf))")
    return Double(after - before)
}

rows.append(Row(case: "mem:settled-leaf-of-chain", impl: "promise", bytes: keptByLeaf({ () -> Promise<Int> in
    let root = Promise<[UInt8]>()
    var step = root.then(on: .immediate) { $0.count }
    for _ in 0..<chainLength { step = step.then(on: .immediate) { $0 &+ 1 } }
    root.fulfill([UInt8](repeating: 1, count: rootValueBytes))
    return step
}, { (try? $0.wait()) ?? -1 }), perItem: false))
#if NIOBaselines
rows.append(Row(case: "mem:settled-leaf-of-chain", impl: "nio", bytes: onLoop {
    Held(value: keptByLeaf({ () -> EventLoopFuture<Int> in
        let root = loop.makePromise(of: [UInt8].self)
        var step = root.futureResult.map { $0.count }
        for _ in 0..<chainLength { step = step.map { $0 &+ 1 } }
        root.succeed([UInt8](repeating: 1, count: rootValueBytes))
        return step
    }, { future in
        final class Seen: @unchecked Sendable { var value = -1 }
        let seen = Seen()
        future.whenSuccess { seen.value = $0 }  // settled: runs at once, on the loop
        return seen.value
    }))
}.value, perItem: false))

try! group.syncShutdownGracefully()
#endif

if CommandLine.arguments.contains("--json") {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    print(String(data: try! encoder.encode(rows), encoding: .utf8)!)
} else {
    for row in rows {
        print("\(row.case)/\(row.impl): \(Int(row.bytes.rounded())) bytes\(row.perItem ? " per item" : " kept")")
    }
}
