// The public API of Promise end to end, from a package of its own (Swift 6 language
// mode, warnings as errors): prints each check, exits 1 if any failed.
import Dispatch
import Foundation
import Promise

@main
@MainActor
struct Consumer {
    static func main() async {
        // A hang is a failure too: give up after a minute.
        DispatchQueue.global().asyncAfter(deadline: .now() + 60) {
            print("FAIL  watchdog: the consumer did not finish within 60 s")
            exit(2)
        }
        let report = Report()
        resolverSide(report)
        await typedChain(report)
        await contexts(report)
        await errors(report)
        await cancellation(report)
        await combinators(report)
        await concurrency(report)
        blocking(report)

        print("\n\(report.passed) passed, \(report.failed) failed")
        exit(report.failed == 0 ? 0 : 1)
    }

    // MARK: Creating and resolving

    static func resolverSide(_ report: Report) {
        report.begin("creating and resolving")
        let p = Promise<Int>()
        report.check(p.isPending && p.state == .pending, "Promise<Int>() is pending")
        report.check(p.fulfill(42), "the first fulfill wins and returns true")
        report.check(!p.fulfill(0) && !p.reject(Failure(code: 1)) && !p.resolve(.success(2)),
                     "later fulfill/reject/resolve return false")
        report.check(p.isFulfilled && p.state == .fulfilled && (try? p.wait()) == 42,
                     "it stays fulfilled with the first value")

        let racers = Promise<Int>()
        let wins = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 8) { i in
            if racers.fulfill(i) { wins.update { $0 += 1 } }
        }
        report.check(wins.current == 1, "exactly one of 8 racing resolvers wins", "\(wins.current) won")

        report.check(Promise(value: 1).isFulfilled, "Promise(value:) is fulfilled")
        let failed = Promise<Int>(error: Failure(code: 7))
        report.check(failed.isRejected && !failed.isCancelled, "Promise(error:) is rejected")
        report.check(Promise(result: Result<Int, any Error>.success(3)).isFulfilled, "Promise(result:) is settled")

        let viaBody = Promise<String> { fulfill, _ in fulfill("sync") }
        report.check((try? viaBody.wait()) == "sync", "Promise { fulfill, reject in } runs its body at once")
        let throwing = Promise<String> { _, _ in throw Failure(code: 9) }
        report.check(throwing.isRejected, "a throwing resolver body rejects")

        let follower = Promise<Int>()
        let source = Promise<Int>()
        follower.resolve(with: source)
        report.check(!follower.fulfill(5), "resolve(with:) locks the follower in")
        source.fulfill(6)
        report.check((try? follower.wait(timeout: .seconds(5))) == 6, "resolve(with:) follows the other promise")
    }

    // MARK: Continuations

    static func typedChain(_ report: Report) async {
        report.begin("a typed chain")
        let input = Promise<Int>()
        let chain = input
            .then { $0 + 1 }                                  // map: Int -> Int
            .then { n in Promise(value: "n=\(n)") }           // flatMap: -> Promise<String>
            .map { $0.count }                                 // String -> Int
            .flatMap { count in Promise<Int>(on: .default) { count * 10 } }
            .validate { $0 > 0 }
        // Checked while pending: once settled, nobody holds the steps in between, and a
        // promise keeps nothing above it.
        report.check(chain.parent?.parent?.parent?.parent?.parent === input && chain.root === input,
                     "each step's parent is the previous one; root is the input")
        input.fulfill(41)
        await report.expect(chain, 40, "then(map) -> then(flatMap) -> map -> flatMap -> validate")

        let both = Promise(value: 2).then({ v in "value \(v)" }, { error in "error \(error)" })
        await report.expect(both, "value 2", "then(onFulfilled, onRejected) on a fulfilled promise")

        let seen = Locked<Result<Int, any Error>?>(nil)
        let observed = Promise<Int>()
        let done = Promise<Void>()
        observed.whenComplete { result in
            seen.update { $0 = result }
            done.fulfill(())
        }
        observed.fulfill(5)
        _ = await done.result
        if case .success(5)? = seen.current {
            report.check(true, "whenComplete observes the outcome")
        } else {
            report.check(false, "whenComplete observes the outcome", "\(String(describing: seen.current))")
        }
    }

    // MARK: Execution contexts

    static func contexts(_ report: Report) async {
        report.begin("execution contexts")
        let settled = Promise(value: 1)

        // .default: a private concurrent queue, off the calling thread.
        let onDefault = settled.then(on: .default) { _ in Thread.isMainThread }
        await report.expect(onDefault, false, ".default runs handlers off the main thread")

        // A serial DispatchQueue: handlers run on it, in registration order.
        let serial = DispatchQueue(label: "consumer.serial")
        let order = Locked<[Int]>([])
        let gate = Promise<Int>()
        let steps = (0..<10).map { i in
            gate.then(on: serial) { _ in
                dispatchPrecondition(condition: .onQueue(serial))
                order.update { $0.append(i) }
            }
        }
        gate.fulfill(0)
        _ = await Promise.allSettled(steps).result
        report.check(order.current == Array(0..<10), "a serial queue runs handlers in registration order",
                     "\(order.current)")

        // No Zalgo: on a settled promise, a queued handler never runs inside `then`.
        let ranInside = serial.sync {
            let flag = Locked(false)
            settled.then(on: serial) { _ in flag.update { $0 = true } }
            return flag.current
        }
        report.check(!ranInside, "no Zalgo: then(on: queue) on a settled promise returns before the handler runs")

        // .immediate: inline, before the settling call returns.
        let inline = Locked(false)
        let pending = Promise<Int>()
        pending.then(on: .immediate) { _ in inline.update { $0 = true } }
        report.check(!inline.current, ".immediate does not run before the promise settles")
        pending.fulfill(1)
        report.check(inline.current, ".immediate runs before fulfill returns")
        let inlineSettled = Locked(false)
        settled.then(on: .immediate) { _ in inlineSettled.update { $0 = true } }
        report.check(inlineSettled.current, ".immediate on a settled promise runs inside then")

        // A consumer-defined ExecutionContext.
        let loop = EventLoop(name: "consumer.loop")
        let onLoop = settled.then(on: loop) { _ in loop.inLoop }
        await report.expect(onLoop, true, "a custom ExecutionContext runs the handler on its own thread")
        report.check(loop.executeCalls >= 1, "the handler went through the custom context's execute")
        let made = Promise<String>(on: loop) { loop.inLoop ? "made on the loop" : "elsewhere" }
        await report.expect(made, "made on the loop", "Promise(on: customContext) { work }")

        // .main, .concurrent(queue), OperationQueue.
        // (On Linux, once an async main has suspended, libdispatch serves the main queue
        // from a worker thread, so the test is "on the main queue", not isMainThread.)
        MainQueueMarker.shared.mark()
        let onMain = settled.then(on: .main) { _ in MainQueueMarker.shared.onMainQueue }
        await report.expect(onMain, true, ".main runs handlers on the main queue")
        let concurrent = DispatchQueue(label: "consumer.concurrent", attributes: .concurrent)
        await report.expect(settled.then(on: concurrent) { $0 + 1 }, 2, "a concurrent DispatchQueue (barrier)")
        await report.expect(settled.then(on: .concurrent(concurrent)) { $0 + 2 }, 3, ".concurrent(queue)")
        let operations = OperationQueue()
        operations.maxConcurrentOperationCount = 1
        await report.expect(settled.then(on: operations) { $0 + 3 }, 4, "an OperationQueue")
    }

    // MARK: Errors

    static func errors(_ report: Report) async {
        report.begin("errors and recovery")
        let skipped = Locked(0)
        let recovered = Promise<Int>(error: Failure(code: 1))
            .then { v -> Int in skipped.update { $0 += 1 }; return v + 1 }
            .then { v -> Int in skipped.update { $0 += 1 }; return v * 2 }
            .recover { _ in -1 }
        await report.expect(recovered, -1, "a rejection skips success handlers until recover handles it")
        report.check(skipped.current == 0, "no success handler ran on the rejected path")

        let thrown = Promise(value: 1).then { _ -> Int in throw Failure(code: 2) }
        await report.expectFailure(thrown, "a throwing handler rejects the child") { ($0 as? Failure)?.code == 2 }

        let mapped = Promise<Int>(error: Failure(code: 3)).mapError { _ in Failure(code: 30) }
        await report.expectFailure(mapped, "mapError replaces the error") { ($0 as? Failure)?.code == 30 }

        let fallback = Promise<Int>(error: Failure(code: 4)).recover { _ in Promise(value: 44) }
        await report.expect(fallback, 44, "recover returning a promise: the child follows it")

        let logged = Locked<[Int]>([])
        let cleaned = Locked(false)
        let passedOn = Promise<Int>(error: Failure(code: 5))
            .catch { error in logged.update { $0.append((error as? Failure)?.code ?? 0) } }
            .always { cleaned.update { $0 = true } }
        await report.expectFailure(passedOn, "catch and always pass the rejection on") { ($0 as? Failure)?.code == 5 }
        report.check(logged.current == [5] && cleaned.current, "catch saw the error; always ran")

        let invalid = Promise(value: -3).validate { $0 > 0 }
        await report.expectFailure(invalid, "validate false rejects with .validationFailure") {
            if case PromiseError.validationFailure = $0 { return true }
            return false
        }

        let handled = Promise<Int>(error: Failure(code: 6)).then({ _ in "fine" }, { error in "handled \(error)" })
        await report.expect(handled, "handled Failure(code: 6)", "then's error handler fulfils the child")
    }

    // MARK: Cancellation

    static func cancellation(_ report: Report) async {
        report.begin("cancellation")
        // Cancel one branch: parent and sibling are untouched.
        let root = Promise<Int>()
        let branchA = root.then { $0 + 1 }
        let branchB = root.then { $0 + 2 }
        branchA.cancel()
        report.check(branchA.isCancelled && branchA.state == .cancelled && !branchA.isRejected,
                     "cancel() settles a branch as cancelled (not rejected)")
        report.check(root.isPending && branchB.isPending, "the parent and the sibling are untouched")
        report.check(branchA.parent === root && branchA.root === root, "parent/root navigate to the top")
        root.fulfill(1)
        await report.expect(branchB, 3, "the sibling still fulfils")
        await report.expectFailure(branchA, "the cancelled branch reports CancellationError") { $0 is CancellationError }

        // A continuation on a cancelled promise: its child is cancelled at once, and its
        // error side still runs, on its context (so awaiting the child does not wait for it).
        let cleanup = Promise<Bool>()
        let afterCancel = branchA.recover { error -> Int in
            _ = cleanup.fulfill(error is CancellationError)
            return 0
        }
        _ = await afterCancel.result
        report.check(afterCancel.isCancelled, "recover cannot turn a cancellation into success")
        await report.expect(cleanup.timeout(.seconds(10)), true, "the error handler still ran with the cancellation error")

        // The resolver side: onCancel forwards to the real work.
        let work = Promise<Data>()
        let stopped = Locked(0)
        work.onCancel { stopped.update { $0 += 1 } }
        let view = work.then { $0.count }
        work.cancel(reason: UserAborted())
        report.check(stopped.current == 1, "onCancel ran once when the promise was cancelled")
        work.cancel()
        report.check(stopped.current == 1, "a second cancel changes nothing")
        await report.expectFailure(view, "cancel(reason:) flows down with that reason") { $0 is UserAborted }
        let late = Locked(false)
        work.onCancel { late.update { $0 = true } }
        report.check(late.current, "onCancel on an already cancelled promise runs at once")

        // root.cancel() cancels the whole tree.
        let top = Promise<Int>()
        let middle = top.then { $0 * 2 }
        let leaves = [middle.then { $0 + 1 }, middle.then(on: .immediate) { $0 + 2 }]
        report.check(leaves[0].root === top, "leaf.root is the top of the tree")
        leaves[1].root.cancel()
        for (index, leaf) in leaves.enumerated() {
            await report.expectFailure(leaf, "root.cancel() reaches leaf \(index)") { $0 is CancellationError }
        }
        report.check(top.isCancelled && middle.isCancelled, "root.cancel() cancels the root and the middle")

        // The Task behind Promise { try await ... } is cancelled with the promise.
        let taskSaw = Promise<String>()
        let backed = Promise<Int> {
            do {
                try await Task.sleep(for: .seconds(30))
                return 1
            } catch {
                taskSaw.fulfill("\(type(of: error))")
                throw error
            }
        }
        try? await Task.sleep(for: .milliseconds(20))
        backed.cancel()
        await report.expect(taskSaw, "CancellationError", "cancelling Promise { try await ... } cancels its Task")

        // A combinator's pending inputs are its owned work.
        let slow = Promise<Int>()
        let fast = Promise<Int>()
        let both = Promise.all([slow, fast])
        both.cancel()
        report.check(slow.isCancelled && fast.isCancelled, "cancelling all([...]) cancels its pending inputs")
    }

    // MARK: Combinators

    static func combinators(_ report: Report) async {
        report.begin("combinators")
        let later = Promise.after(.milliseconds(20)).then { 3 }
        await report.expect(Promise.all([Promise(value: 1), Promise<Int>(on: .default) { 2 }, later]),
                            [1, 2, 3], "all: values in input order")
        await report.expect(Promise<Int>.all([]), [], "all([]) fulfils with []")
        await report.expectFailure(Promise.all([Promise(value: 1), Promise<Int>(error: Failure(code: 11))]),
                                   "all rejects with the first error") { ($0 as? Failure)?.code == 11 }

        await report.expect(Promise.any([Promise<Int>(error: Failure(code: 1)), Promise(value: 5).delay(.milliseconds(10))]),
                            5, "any: the first fulfilment wins over rejections")
        await report.expectFailure(Promise.any([Promise<Int>(error: Failure(code: 1)), Promise<Int>(error: Failure(code: 2))]),
                                   "any: all rejected -> .allRejected with every error") {
            if case PromiseError.allRejected(let errors) = $0 {
                return errors.compactMap { ($0 as? Failure)?.code } == [1, 2]
            }
            return false
        }

        await report.expect(Promise.race([Promise(value: 1).delay(.milliseconds(300)), Promise(value: 2)]),
                            2, "race: the first to settle")

        let settled = await Promise.allSettled([Promise(value: 1), Promise<Int>(error: Failure(code: 12))]).result
        if case .success(let outcomes) = settled, outcomes.count == 2,
           case .success(1) = outcomes[0], case .failure(let error) = outcomes[1],
           (error as? Failure)?.code == 12 {
            report.check(true, "allSettled: every outcome, never rejects")
        } else {
            report.check(false, "allSettled: every outcome, never rejects", "\(settled)")
        }

        let tuple = await Promise(value: 1).and(Promise(value: "two"), Promise(value: 3.0)).result
        if case .success(let (a, b, c)) = tuple {
            report.check(a == 1 && b == "two" && c == 3.0, "and: a heterogeneous tuple", "\((a, b, c))")
        } else {
            report.check(false, "and: a heterogeneous tuple", "\(tuple)")
        }

        let started = Locked<[Int]>([])
        let sequenced = Promise.sequence([1, 2, 3]) { x in
            started.update { $0.append(x) }
            return Promise.after(.milliseconds(5)).then { x * 10 }
        }
        await report.expect(sequenced, [10, 20, 30], "sequence: one after another, values in order")
        report.check(started.current == [1, 2, 3], "sequence started the steps in order")

        let attempts = Locked(0)
        let retried = Promise.retry(attempts: 3, delay: .milliseconds(10)) { () -> Promise<Int> in
            let n = attempts.update { $0 += 1; return $0 }
            return n < 3 ? Promise(error: Failure(code: n)) : Promise(value: n)
        }
        await report.expect(retried, 3, "retry: succeeds on the third attempt")
        let calls = Locked(0)
        let exhausted = Promise.retry(attempts: 3) { () -> Promise<Int> in
            Promise(error: Failure(code: calls.update { $0 += 1; return $0 }))
        }
        await report.expectFailure(exhausted, "retry: gives up after 3 calls with the last error") {
            ($0 as? Failure)?.code == 3
        }
        report.check(calls.current == 3, "retry called its body 3 times in all", "\(calls.current)")

        let never = Promise<Int>()
        await report.expectFailure(never.timeout(.milliseconds(30)), "timeout rejects with .timedOut") {
            if case PromiseError.timedOut = $0 { return true }
            return false
        }
        report.check(never.isPending, "timeout leaves the receiver untouched")

        let start = ContinuousClock.now
        await report.expect(Promise(value: 7).delay(.milliseconds(30)), 7, "delay passes the value on")
        report.check(ContinuousClock.now - start >= .milliseconds(30), "delay waited")

        await report.expect(Promise.wrap { done in legacyResult(8, completion: done) }, 8,
                            "wrap: a Result completion handler")
        await report.expect(Promise.wrap { done in legacyOptional(9, completion: done) }, 9,
                            "wrap: a (value?, error?) completion handler")
        await report.expectFailure(Promise.wrap { done in legacyOptional(nil, completion: done) },
                                   "wrap: (nil, error) rejects") { ($0 as? Failure)?.code == 404 }
        await report.expect(Promise.wrap { done in legacyValue("v", completion: done) }, "v",
                            "wrap: a value-only completion handler")
    }

    // MARK: Swift concurrency

    static func concurrency(_ report: Report) async {
        report.begin("Swift concurrency")
        do {
            let value = try await Promise(value: 1).then(on: .default) { $0 + 1 }.value
            report.check(value == 2, "try await p.value")
        } catch {
            report.check(false, "try await p.value", "threw \(error)")
        }
        do {
            _ = try await Promise<Int>(error: Failure(code: 21)).value
            report.check(false, "await p.value throws the rejection")
        } catch {
            report.check((error as? Failure)?.code == 21, "await p.value throws the rejection", "\(error)")
        }
        let fetched = Promise<String> {
            try await Task.sleep(for: .milliseconds(5))
            return "from a Task"
        }
        await report.expect(fetched, "from a Task", "Promise { try await ... }")

        let pending = Promise<Int>()
        let waiter = Task { try await pending.value }
        try? await Task.sleep(for: .milliseconds(20))
        waiter.cancel()
        switch await waiter.result {
        case .success: report.check(false, "cancelling the awaiting Task makes the waiter throw")
        case .failure(let error):
            report.check(error is CancellationError, "cancelling the awaiting Task makes the waiter throw CancellationError")
        }
        report.check(pending.isPending, "... and leaves the promise itself untouched")
    }

    // MARK: Blocking

    static func blocking(_ report: Report) {
        report.begin("blocking")
        report.check((try? Promise<Int>(on: .default) { 42 }.wait()) == 42, "wait() returns the value")
        do {
            _ = try Promise<Int>().wait(timeout: .milliseconds(20))
            report.check(false, "wait(timeout:) throws .timedOut")
        } catch PromiseError.timedOut {
            report.check(true, "wait(timeout:) throws .timedOut")
        } catch {
            report.check(false, "wait(timeout:) throws .timedOut", "threw \(error)")
        }
    }
}
