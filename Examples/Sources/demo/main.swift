// A tour of the Promise library, printing what happens and when.
// Run it with `make demo`. This file's top level awaits, so it is async code: it awaits
// promises (`await p.value`) and leaves blocking (`wait`) to a synchronous function.
import Dispatch
import Foundation
import Promise

let start = DispatchTime.now()
func say(_ text: String) {
    let ms = Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e6
    print(String(format: "[%7.2f ms] ", ms) + text)
}

struct LookupError: Error, CustomStringConvertible {
    let key: String
    var description: String { key.isEmpty ? "no entry for an empty key" : "no entry for \(key)" }
}

/// A slow lookup: the promise is fulfilled later, from a background queue.
func lookup(_ key: String, after milliseconds: Int) -> Promise<Int> {
    let promise = Promise<Int>()
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(milliseconds)) {
        if key.isEmpty { promise.reject(LookupError(key: key)) } else { promise.fulfill(key.count * 10) }
    }
    return promise
}

// 1. A typed chain: Int -> Int -> String.
say("1. typed chain")
let label = lookup("answer", after: 20)
    .then { $0 + 2 }
    .then { "the answer is \($0)" }
say("   \(try await label.value)")

// 2. An error skips the success handlers until an error handler takes it.
say("2. error caught down the chain")
let recovered = lookup("", after: 10)
    .then { value -> Int in
        say("   never printed: \(value)")
        return value
    }
    .catch { say("   catch saw: \($0)") }
    .recover { _ in -1 }
say("   recovered with \(try await recovered.value)")

// 3. Cancelling one branch leaves its sibling alone.
say("3. cancel a branch, the sibling still gets its value")
let shared = lookup("shared", after: 30)
let cancelledBranch = shared.then { "branch A got \($0)" }
let siblingBranch = shared.then { "branch B got \($0)" }
cancelledBranch.cancel()
say("   branch A: \(cancelledBranch.state)")
say("   \(try await siblingBranch.value)")
say("   branch A after the parent fulfilled: \(cancelledBranch.state)")

// 4. Handlers on a concurrent queue are serialised by a barrier.
say("4. 8 handlers on one concurrent queue, each 5 ms of work")
let queue = DispatchQueue(label: "demo.concurrent", attributes: .concurrent)
final class Overlap: @unchecked Sendable {
    private let lock = NSLock()
    private var running = 0
    private(set) var maximum = 0
    func enter() { lock.lock(); running += 1; maximum = max(maximum, running); lock.unlock() }
    func leave() { lock.lock(); running -= 1; lock.unlock() }
}
let overlap = Overlap()
let ready = Promise<Void>()
let handlers = (0..<8).map { index in
    ready.then(on: queue) { () -> Int in
        overlap.enter()
        Thread.sleep(forTimeInterval: 0.005)
        overlap.leave()
        return index
    }
}
ready.fulfill(())
let order = try await Promise.all(handlers).value
say("   ran in order \(order), at most \(overlap.maximum) at a time")

// 5. .immediate: a 100,000-step chain settles inline, without growing the stack.
say("5. a 100,000-step .immediate chain")
let first = Promise<Int>()
var last = first
for _ in 0..<100_000 { last = last.then(on: .immediate) { $0 + 1 } }
first.fulfill(0)
say("   last step holds \(try await last.value)")

// 6. Combinators: all keeps input order, race takes the first to settle.
say("6. all and race over three lookups (30, 10, 20 ms)")
let lookups = [lookup("alpha", after: 30), lookup("be", after: 10), lookup("gam", after: 20)]
say("   all:  \(try await Promise.all(lookups).value)")
let racers = [lookup("slow", after: 40), lookup("fast!", after: 5)]
say("   race: \(try await Promise.race(racers).value) (the fast one)")

// 7. async/await: awaiting a promise suspends, it does not block a thread.
say("7. await p.value")
let awaited = try await lookup("awaited", after: 10).then { $0 * 2 }.value
say("   awaited \(awaited)")

// 8. Blocking with a timeout: synchronous code only (`wait` is unavailable from async
// code, where it would block one of the few threads every Task runs on).
func blockingRead(_ promise: Promise<Int>, timeout: Duration) throws -> Int {
    try promise.wait(timeout: timeout)
}
say("8. wait(timeout:) on a promise nobody settles, from synchronous code")
do {
    _ = try blockingRead(Promise<Int>(), timeout: .milliseconds(50))
} catch {
    say("   \(error)")
}

// 9. Diagnostics: the library never prints, it reports to the handler you set.
say("9. diagnostics: a dropped promise and an error nobody saw (debug builds also say where each was made)")
PromiseDiagnostics.setHandler { event in say("   reported: \(event)") }
func placeOrder() -> Promise<Int> {
    let order = Promise<Int>()  // nobody settles it, and it is dropped on return
    return order.then { $0 + 1 }
}
let confirmation = placeOrder()
say("   the dependent got: \(await confirmation.result)")
do {
    let audit = Promise<Int>()
    audit.reject(LookupError(key: "audit"))  // rejected, and nobody looks at it
}
PromiseDiagnostics.setHandler(nil)
say("done")
