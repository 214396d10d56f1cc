// Memory under churn: two threads create promises by the hundred per round (chained on
// .immediate and on queues, fulfilled, rejected, cancelled, followed, aggregated, or
// dropped while pending), settle them (some from the other thread) and let go. Every
// round checks that nothing stays alive: every value, error and captured token the
// round created is freed (a promise that leaks keeps its token), and a sample of the
// promises themselves is gone (weak references); and that the resident set, read from
// /proc/self/statm, stays within PROMISE_STRESS_RSS_GROWTH_MIB of its level after the
// warm-up rounds.
import Dispatch
import Foundation
import Promise
import Synchronization
import XCTest

/// An error that counts as a live token while it exists.
private final class TokenError: Error, Sendable {
    let token: LiveToken

    init(_ id: Int) {
        token = LiveToken(id)
    }
}

private struct WeakPromise: @unchecked Sendable {
    weak var promise: AnyPromise?
}

final class MemoryChurnStressTests: XCTestCase {
    /// Chains per seat per round.
    private static let chainsPerSeat = 128

    func testHighChurnKeepsResidentSetFlatAndLeavesNothingAlive() {
        let seats = 2
        let crew = Crew(size: seats)
        defer { crew.stop() }
        let promisesCreated = Atomic<Int>(0)
        let limit = StressConfiguration.iterations
        let warmup = max(3, min(100, limit / 10))
        let growthLimit = StressConfiguration.rssGrowthLimitMiB << 20
        var startRSS = 0, baselineRSS = 0, peakRSS = 0, endRSS = 0
        var sampledPromises = 0
        let mib = { (bytes: Int) in String(format: "%.1f MiB", Double(bytes) / 1_048_576) }

        XCTAssertNotNil(residentSetBytes(), "cannot read /proc/self/statm")
        startRSS = residentSetBytes() ?? 0
        let liveBefore = LiveToken.count

        runStressRounds("memory churn", invariants: [
            "every token of the round freed (no live promise holds one)", "sampled promises deallocated (weak refs nil)",
            "resident set within the growth limit of its post-warm-up level",
        ], details: {
            "\(promisesCreated.load(ordering: .relaxed)) promises created; resident set at start \(mib(startRSS)), "
                + "after warm-up \(mib(baselineRSS)), peak \(mib(peakRSS)), end \(mib(endRSS)) "
                + "(limit: warm-up level + \(StressConfiguration.rssGrowthLimitMiB) MiB); \(sampledPromises) sampled promises checked"
        }) { checker in
            let round = checker.round
            let samples = (0..<seats).map { _ in SeatBox<WeakPromise>() }
            // Promises one seat hands to the other to settle.
            let handoff = (0..<seats).map { _ in SeatBox<Promise<LiveToken>>() }

            let finished = crew.play { seat in
                var created = 0
                let box = samples[seat]
                func sample(_ promise: AnyPromise) { box.items.append(WeakPromise(promise: promise)) }
                for j in 0..<MemoryChurnStressTests.chainsPerSeat {
                    let id = round * 1_000 + j
                    switch j % 9 {
                    case 0:  // an .immediate chain, fulfilled
                        let root = Promise<LiveToken>()
                        let leaf = root.then(on: .immediate) { LiveToken($0.id + 1) }.map(on: .immediate) { $0.id }
                        root.fulfill(LiveToken(id))
                        created += 3
                        if j % 18 == 0 { sample(root); sample(leaf) }
                    case 1:  // queued handlers, fulfilled
                        let root = Promise<LiveToken>()
                        let token = LiveToken(id)
                        let leaf = root.then { [token] in LiveToken($0.id + token.id) }.always(on: ContextKind.serialQueue) {}
                        root.fulfill(LiveToken(id))
                        created += 3
                        if j % 18 == 1 { sample(leaf) }
                    case 2:  // rejected, recovered
                        let root = Promise<LiveToken>()
                        let recovered = root.recover(on: .immediate) { _ in LiveToken(id) }.catch(on: .default) { _ in }
                        root.reject(TokenError(id))
                        created += 3
                        if j % 18 == 2 { sample(root); sample(recovered) }
                    case 3:  // a pending tree cancelled from the root
                        let root = Promise<LiveToken>()
                        let token = LiveToken(id)
                        let child = root.then { [token] _ in token.id }
                        _ = child.then(on: .immediate) { $0 + 1 }
                        _ = root.recover { _ in LiveToken(id) }
                        root.onCancel { [token] in _ = token }
                        root.cancel(reason: TokenError(id))
                        created += 4
                        if j % 18 == 3 { sample(child) }
                    case 4:  // dropped while pending: nobody will ever settle it
                        let root = Promise<LiveToken>()
                        let token = LiveToken(id)
                        let leaf = root.then { [token] in $0.id + token.id }.then(on: .immediate) { $0 }
                        root.whenComplete { [token] _ in _ = token }
                        created += 3
                        sample(root)
                        sample(leaf)
                    case 5:  // flatMap following a promise settled later, from the other seat
                        let root = Promise<LiveToken>()
                        let inner = Promise<LiveToken>()
                        let leaf = root.flatMap(on: .immediate) { _ in inner }
                        root.fulfill(LiveToken(id))
                        handoff[seat].items.append(inner)
                        created += 3
                        if j % 18 == 5 { sample(leaf) }
                    case 6:  // combinators
                        let a = Promise<LiveToken>(), b = Promise<LiveToken>()
                        let all = Promise.all([a, b])
                        let race = Promise.race([a, b])
                        a.fulfill(LiveToken(id))
                        b.reject(TokenError(id))
                        created += 4
                        if j % 18 == 6 { sample(all); sample(race) }
                    case 7:  // resolve(with:) and a timed-out wait
                        let source = Promise<LiveToken>()
                        let follower = Promise<LiveToken>()
                        follower.resolve(with: source)
                        _ = try? follower.wait(timeout: .microseconds(20))  // not zero: that polls
                        source.fulfill(LiveToken(id))
                        created += 2
                        if j % 18 == 7 { sample(follower) }
                    default:  // settled on another context's thread
                        let root = Promise<LiveToken>(on: .default) { LiveToken(id) }
                        let leaf = root.then(on: .immediate) { $0.id }
                        created += 2
                        if j % 18 == 8 { sample(leaf) }
                    }
                }
                promisesCreated.add(created, ordering: .relaxed)
                crew.barrier.arriveAndWait()
                // Settle the promises the other seat handed over.
                for inner in handoff[(seat + 1) % seats].items {
                    inner.fulfill(LiveToken(-1))
                }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }
            for box in handoff { box.items.removeAll() }  // the round's own references go
            let weakRefs = samples.flatMap(\.items)
            sampledPromises += weakRefs.count
            // Queued handlers release what they captured when they have run: wait for it.
            let freed = pumpMainRunLoop {
                LiveToken.count == liveBefore && weakRefs.allSatisfy { $0.promise == nil }
            }
            if !freed {
                let alive = weakRefs.filter { $0.promise != nil }
                checker.fail("after the round: \(LiveToken.count - liveBefore) tokens still alive, "
                             + "\(alive.count) of \(weakRefs.count) sampled promises still alive "
                             + "(states \(alive.prefix(5).compactMap { $0.promise?.state }))")
                return false
            }
            if let rss = residentSetBytes() {
                peakRSS = max(peakRSS, rss)
                endRSS = rss
                if round + 1 == warmup { baselineRSS = rss }
                if round + 1 > warmup {
                    checker.check(rss <= baselineRSS + growthLimit,
                                  "resident set \(mib(rss)) grew more than \(StressConfiguration.rssGrowthLimitMiB) MiB "
                                      + "over its post-warm-up level \(mib(baselineRSS))")
                }
            }
            return true
        }
        if baselineRSS == 0 { baselineRSS = endRSS }
    }
}
