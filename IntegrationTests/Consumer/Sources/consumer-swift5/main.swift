// The same API from Swift 5 language mode (swiftSettings: .swiftLanguageMode(.v5)), the
// way an existing app that has not moved to Swift 6 uses it: top-level code, a plain
// class for shared state, blocking waits (in a synchronous function) and `await`. Built
// with warnings as errors.
import Dispatch
import Foundation
import Promise

struct LegacyError: Error {
    let code: Int
}

/// Shared state in Swift 5 style: a class with a lock.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0

    func increment() {
        lock.lock()
        count += 1
        lock.unlock()
    }

    var value: Int {
        lock.lock()
        defer { lock.unlock() }
        return count
    }
}

/// A custom context: every handler goes through a serial queue, and is counted.
struct CountingContext: ExecutionContext {
    let queue: DispatchQueue
    let counter: Counter

    func execute(_ work: @escaping @Sendable () -> Void) {
        counter.increment()
        queue.async(execute: work)
    }
}

var passed = 0
var failures = 0
func check(_ condition: Bool, _ what: String) {
    print(condition ? "  ok    \(what)" : "  FAIL  \(what)")
    if condition { passed += 1 } else { failures += 1 }
}

print("== Swift 5 language mode")

// Blocking waits belong to synchronous code: `wait` is unavailable from async code (this
// file's top level awaits below, which makes all of it async), where it would block a
// thread of Swift concurrency's pool.
func blockingChecks() {
    // A typed chain across contexts.
    let serial = DispatchQueue(label: "swift5.serial")
    let counted = CountingContext(queue: serial, counter: Counter())
    let input = Promise<Int>()
    let chain = input
        .then(on: .default) { $0 + 1 }
        .then(on: serial) { "n=\($0)" }
        .then(on: counted) { $0.count }
        .flatMap(on: .immediate) { Promise(value: $0 * 2) }
    input.fulfill(9)
    check((try? chain.wait(timeout: .seconds(5))) == 8, "a chain across .default, a queue, a custom context and .immediate")
    check(counted.counter.value == 1, "the custom context ran its handler")

    // Errors and recovery.
    let recovered = Promise<Int>(error: LegacyError(code: 1))
        .then { $0 * 100 }
        .recover { error in (error as? LegacyError)?.code ?? 0 }
    check((try? recovered.wait()) == 1, "recover handles a rejection that skipped then")

    // Cancellation.
    let root = Promise<String>()
    let branch = root.then { $0.uppercased() }
    let sibling = root.then { $0 + "!" }
    let stopped = Counter()
    root.onCancel { stopped.increment() }
    branch.cancel()
    root.fulfill("hi")
    check(branch.isCancelled && (try? sibling.wait()) == "hi!", "cancelling a branch leaves its sibling alone")
    let tree = Promise<Int>()
    let leaf = tree.then { $0 }.then { $0 }
    leaf.root.cancel()
    check(tree.isCancelled && stopped.value == 0, "root.cancel() cancels the tree; onCancel only on the cancelled one")

    // Combinators.
    check((try? Promise.all([Promise(value: 1), Promise(value: 2)]).wait()) == [1, 2], "all")
    check((try? Promise.any([Promise<Int>(error: LegacyError(code: 2)), Promise(value: 3)]).wait()) == 3, "any")
    check((try? Promise.race([Promise(value: 4), Promise<Int>()]).wait()) == 4, "race")
    check((try? Promise.allSettled([Promise(value: 5)]).wait())?.count == 1, "allSettled")
    if let (number, word) = try? Promise(value: 6).and(Promise(value: "six")).wait() {
        check(number == 6 && word == "six", "and")
    } else {
        check(false, "and")
    }
    check((try? Promise.sequence([1, 2]) { Promise(value: $0) }.wait()) == [1, 2], "sequence")
    check((try? Promise.retry(attempts: 2) { Promise(value: 7) }.wait()) == 7, "retry")
    // Held: a pending promise that everyone drops breaks its dependents (brokenPromise) instead.
    let neverSettled = Promise<Int>()
    do {
        _ = try neverSettled.timeout(.milliseconds(10)).wait()
        check(false, "timeout rejects with .timedOut")
    } catch PromiseError.timedOut {
        check(true, "timeout rejects with .timedOut")
    } catch {
        check(false, "timeout rejects with .timedOut (threw \(error))")
    }
    withExtendedLifetime(neverSettled) {}
    check((try? Promise.wrap { (done: @escaping @Sendable (Result<Int, Error>) -> Void) in done(.success(8)) }.wait()) == 8,
          "wrap")
}
blockingChecks()

// Swift concurrency from Swift 5 mode.
let awaited = try? await Promise(value: 10).then { $0 + 1 }.value
check(awaited == 11, "await p.value")
let outcome = await Promise<Int>(error: LegacyError(code: 3)).result
if case .failure(let error) = outcome {
    check((error as? LegacyError)?.code == 3, "await p.result")
} else {
    check(false, "await p.result")
}

print("swift5: \(passed) passed, \(failures) failed")
exit(failures == 0 ? 0 : 1)
