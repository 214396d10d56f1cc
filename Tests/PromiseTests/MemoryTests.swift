// Memory: chains are freed when the user lets go (settled or pending, no retain cycles),
// a promise keeps nothing above it once its handler ran, and long chains neither overflow the stack when they
// settle nor when they are released.
import Dispatch
import Foundation
import Promise
import XCTest

final class MemoryTests: XCTestCase {

    // MARK: Freed when dropped

    func testSettledImmediateChainIsFreed() {
        weak var weakRoot: Promise<Int>?
        weak var weakMiddle: Promise<Int>?
        weak var weakLeaf: Promise<String>?
        do {
            let root = Promise<Int>()
            let middle = root.then(on: .immediate) { $0 + 1 }
            let leaf = middle.then(on: .immediate) { "\($0)" }
            weakRoot = root; weakMiddle = middle; weakLeaf = leaf
            root.fulfill(1)
            XCTAssertEqual(leaf.state, .fulfilled)
        }
        XCTAssertNil(weakRoot)
        XCTAssertNil(weakMiddle)
        XCTAssertNil(weakLeaf)
    }

    func testSettledChainOnQueuesIsFreed() {
        weak var weakRoot: Promise<Int>?
        weak var weakLeaf: Promise<Int>?
        weak var weakInner: Promise<Int>?
        do {
            let root = Promise<Int>()
            let inner = Promise<Int>()
            let leaf = root
                .then { $0 + 1 }
                .flatMap(on: DispatchQueue(label: "PromiseTests.mem")) { v -> Promise<Int> in
                    inner.fulfill(v)
                    return inner
                }
                .recover { _ in 0 }
                .always {}
            weakRoot = root; weakLeaf = leaf; weakInner = inner
            root.fulfill(1)
            XCTAssertEqual(value(leaf), 2)
        }
        // Dispatched blocks release their captures right after they run: no event to
        // wait on, so poll (bounded) for the references to go.
        XCTAssertTrue(eventually { weakRoot == nil && weakLeaf == nil && weakInner == nil },
                      "root \(weakRoot != nil), leaf \(weakLeaf != nil), inner \(weakInner != nil)")
    }

    /// Dropping a pending root breaks what waits on it (its children end rejected with
    /// `brokenPromise`, on their contexts), and then all of it is freed.
    func testDroppedPendingChainIsBrokenThenFreed() {
        weak var weakRoot: Promise<Int>?
        weak var weakChild: Promise<Int>?
        weak var weakGrandchild: Promise<String>?
        let seen = Recorder<String>()
        do {
            let root = Promise<Int>()
            let child = root.then { $0 + 1 }
            let grandchild = child.map { "\($0)" }
            grandchild.whenComplete { seen.append("\($0)") }
            weakRoot = root; weakChild = child; weakGrandchild = grandchild
        }
        XCTAssertNil(weakRoot)
        XCTAssertTrue(eventually { weakChild == nil && weakGrandchild == nil },
                      "child \(weakChild != nil), grandchild \(weakGrandchild != nil)")
        XCTAssertTrue(eventually { !seen.values.isEmpty })
        XCTAssertEqual(seen.values, ["failure(\(PromiseError.brokenPromise))"])
    }

    /// A pending tree with every kind of observer on it (children of every form,
    /// whenComplete, onCancel, a timed-out wait, a promise a child follows, a resolve(with:)
    /// follower) is freed once the user lets go and the broken root's observers have run
    /// (on their contexts): nothing forms a cycle.
    func testDroppedPendingTreeWithEveryObserverKindIsFreed() {
        var weakRefs: [() -> AnyPromise?] = []
        func track(_ p: AnyPromise) {
            weak let w = p
            weakRefs.append { w }
        }
        do {
            let root = Promise<Int>()
            let children: [AnyPromise] = [
                root.then { $0 }, root.then { v in Promise(value: v) }, root.then({ $0 }, { _ in 0 }),
                root.map { $0 }, root.flatMap { Promise(value: $0) }, root.recover { _ in 0 },
                root.recover { _ in Promise(value: 0) }, root.mapError { $0 }, root.catch { _ in },
                root.always {}, root.validate { _ in true }, root.then(on: .immediate) { $0 },
            ]
            children.forEach(track)
            let grandchild = root.then { $0 }.then { $0 }
            track(grandchild)
            root.whenComplete { _ in }
            root.onCancel {}
            XCTAssertThrowsError(try root.wait(timeout: .milliseconds(1)))
            let follower = Promise<Int>()
            follower.resolve(with: root)
            track(follower)
            track(root)
        }
        for (i, ref) in weakRefs.enumerated() {
            XCTAssertTrue(eventually { ref() == nil }, "promise \(i) is still alive")
        }
    }

    func testChildKeptByUserOfADroppedPendingParentEndsBroken() {
        weak var weakParent: Promise<Int>?
        let child: Promise<Int>
        do {
            let parent = Promise<Int>()
            weakParent = parent
            child = parent.then { $0 }
        }
        XCTAssertNil(weakParent, "a pending child kept its pending parent alive")
        XCTAssertNil(child.parent)
        guard case PromiseError.brokenPromise? = error(child) else { return XCTFail("\(child.state)") }
        XCTAssertTrue(child.isRejected, "a broken child is rejected, not cancelled")
    }

    func testRecoverTurnsABrokenParentIntoAValue() {
        let recovered: Promise<Int>
        do {
            recovered = Promise<Int>().recover(on: .immediate) { error in
                if case PromiseError.brokenPromise = error { return -1 }
                throw error
            }
        }
        XCTAssertEqual(value(recovered), -1)
    }

    // MARK: Handlers are released once done with

    /// Something a handler captures, to see when the handler is released.
    private final class Token: Sendable {
        func use(_ value: Int) -> Int { value }
    }

    /// A child of every continuation form on `parent`, each handler capturing `token`.
    private func childrenOfEveryForm(of parent: Promise<Int>, on context: any ExecutionContext,
                                     capturing token: Token) -> [AnyPromise] {
        [
            parent.then(on: context) { token.use($0) },
            parent.then(on: context) { Promise(value: token.use($0)) },
            parent.then(on: context, { token.use($0) }, { _ in token.use(0) }),
            parent.recover(on: context) { _ in token.use(0) },
            parent.recover(on: context) { _ in Promise(value: token.use(0)) },
            parent.mapError(on: context) { _ = token; return $0 },
            parent.catch(on: context) { _ in _ = token },
            parent.always(on: context) { _ = token },
            parent.validate(on: context) { token.use($0) > 0 },
        ]
    }

    /// Registers a child of every form on a pending promise, settles it with `settle`, and
    /// checks that every handler (run or skipped) was released while the children live on.
    private func assertHandlersReleased(on context: any ExecutionContext, after settle: (Promise<Int>) -> Void,
                                        file: StaticString = #filePath, line: UInt = #line) {
        weak var weakToken: Token?
        let parent = Promise<Int>()
        var children: [AnyPromise] = []
        do {
            let token = Token()
            weakToken = token
            children = childrenOfEveryForm(of: parent, on: context, capturing: token)
        }
        XCTAssertNotNil(weakToken, "pending handlers must keep their captures", file: file, line: line)
        settle(parent)
        XCTAssertTrue(eventually { weakToken == nil }, "a handler outlived its run", file: file, line: line)
        XCTAssertTrue(eventually { children.allSatisfy { !$0.isPending } }, file: file, line: line)
        XCTAssertEqual(children.count, 9, file: file, line: line)  // still alive here
    }

    func testHandlersAreReleasedWhenTheyRunOrAreSkipped() {
        assertHandlersReleased(on: .immediate) { $0.fulfill(1) }
        assertHandlersReleased(on: .immediate) { $0.reject(TestError(1)) }
        assertHandlersReleased(on: .immediate) { $0.cancel() }
        let queue = DispatchQueue(label: "PromiseTests.handlers")
        assertHandlersReleased(on: queue) { $0.fulfill(1) }
        assertHandlersReleased(on: queue) { $0.reject(TestError(1)) }
        assertHandlersReleased(on: queue) { $0.cancel() }
    }

    func testHandlersOfChildrenSettledFirstAreReleasedUnrun() {
        weak var weakToken: Token?
        let parent = Promise<Int>()
        let ran = Counter()
        var children: [Promise<Int>] = []
        do {
            let token = Token()
            weakToken = token
            children = [
                parent.then(on: .immediate) { ran.increment(); return token.use($0) },
                parent.then { ran.increment(); return token.use($0) },
            ]
        }
        children.forEach { $0.fulfill(7) }
        parent.fulfill(1)
        XCTAssertTrue(eventually { weakToken == nil })
        XCTAssertEqual(ran.value, 0, "a handler ran for a child settled by someone else")
        XCTAssertEqual(children.map { value($0) }, [7, 7])
    }

    /// The handlers of a dropped pending tree run their error side (or are skipped) with
    /// `brokenPromise`, and are released then, also when a child is kept.
    func testHandlersOfADroppedPendingTreeAreReleasedOnceBroken() {
        weak var weakToken: Token?
        let kept: AnyPromise
        do {
            let token = Token()
            weakToken = token
            let parent = Promise<Int>()
            kept = childrenOfEveryForm(of: parent, on: .default, capturing: token)[0]
        }
        XCTAssertTrue(eventually { weakToken == nil }, "a broken child's handler was not released")
        XCTAssertTrue(eventually { kept.isRejected })
    }

    /// A pending parent dies while its child, and the child's child, live: every link up
    /// to it answers nil from then on, `root` stops at the orphan, and the orphans end
    /// broken instead of waiting for ever.
    func testPendingParentDroppedWhileDescendantsLiveBreaksThem() {
        weak var weakParent: Promise<Int>?
        var child: Promise<Int>?
        var grandchild: Promise<String>?
        do {
            let parent = Promise<Int>()
            weakParent = parent
            child = parent.then(on: .immediate) { $0 + 1 }
            grandchild = child?.map { "\($0)" }
            XCTAssertTrue(grandchild?.root === parent)
        }
        XCTAssertNil(weakParent)
        guard let child, let grandchild else { return XCTFail("dropped too early") }
        XCTAssertNil(child.parent)
        XCTAssertTrue(child.root === child)
        XCTAssertTrue(grandchild.parent === child)
        XCTAssertTrue(grandchild.root === child)
        XCTAssertEqual(child.state, .rejected, "an .immediate child breaks as its parent dies")
        guard case PromiseError.brokenPromise? = error(grandchild) else { return XCTFail("\(grandchild.state)") }
        child.cancel(reason: TestError(7))
        XCTAssertEqual(grandchild.state, .rejected, "a later cancel does not change a settled child")
    }

    /// The promise a handler returned dies pending while the child that follows it lives
    /// (nothing else holds it): the follower ends broken, and a cancel afterwards does not
    /// touch the freed promise.
    func testFollowedPromiseDroppedPendingBreaksItsFollower() {
        final class WeakBox: @unchecked Sendable { weak var promise: AnyPromise? }
        let followedRef = WeakBox()
        let parent = Promise<Int>()
        let follower = parent.flatMap(on: .immediate) { _ -> Promise<Int> in
            let followed = Promise<Int>()
            followedRef.promise = followed
            return followed
        }
        parent.fulfill(1)
        XCTAssertNil(followedRef.promise, "the follower kept the promise it follows alive")
        guard case PromiseError.brokenPromise? = error(follower) else { return XCTFail("\(follower.state)") }
        follower.cancel(reason: TestError(8))
        XCTAssertEqual(follower.state, .rejected)
    }

    func testResolveWithADroppedPendingPromiseBreaksTheFollower() {
        let follower = Promise<Int>()
        do { follower.resolve(with: Promise<Int>()) }
        guard case PromiseError.brokenPromise? = error(follower) else { return XCTFail("\(follower.state)") }
    }

    /// Cancelling a follower cancels the promise it follows while that one is alive (the
    /// follower reaches it through its unowned link).
    func testCancellingFollowerCancelsTheLiveFollowedPromise() {
        let followed = Promise<Int>()
        let parent = Promise<Int>()
        let follower = parent.flatMap(on: .immediate) { _ in followed }
        parent.fulfill(1)
        follower.cancel(reason: TestError(9))
        assertCancelled(follower, reason: 9)
        assertCancelled(followed, reason: 9)
    }

    /// A child in flight on a queue links itself into its settled parent's cancellation
    /// registry without being kept by it: once its handler ran and nobody holds it, it is
    /// freed, and a cancel forwarded through the parent afterwards finds a dead link (and
    /// drops it) instead of a freed child.
    func testChildInFlightIsFreedThenParentCancelSkipsItsLink() {
        let queue = DispatchQueue(label: "PromiseTests.registry")
        let parent = Promise(value: 1)
        weak var weakChild: Promise<Int>?
        var kept: Promise<Int>?
        do {
            let child = parent.then(on: queue) { $0 + 1 }
            weakChild = child
            kept = parent.then(on: queue) { $0 + 2 }
        }
        queue.sync {}
        XCTAssertTrue(eventually { weakChild == nil }, "the registry kept a settled child alive")
        parent.cancel(reason: TestError(5))
        XCTAssertEqual(parent.state, .fulfilled)
        XCTAssertEqual(kept.map { value($0) }, 3)
        kept = nil
    }

    /// An aggregate holds its inputs without keeping them: an input dropped while pending
    /// is freed, and counts as rejected with `brokenPromise`; the other inputs are left
    /// alone, and a later cancel of the aggregate still cancels them.
    func testAggregateInputDroppedPendingCountsAsBroken() {
        weak var weakDropped: Promise<Int>?
        let kept = Promise<Int>()
        let all: Promise<[Int]>, any: Promise<Int>
        do {
            let dropped = Promise<Int>()
            weakDropped = dropped
            all = Promise.all([kept, dropped])
            any = Promise.any([kept, dropped])
        }
        XCTAssertNil(weakDropped, "the aggregate kept a pending input alive")
        guard case PromiseError.brokenPromise? = error(all) else { return XCTFail("\(all.state)") }
        XCTAssertTrue(kept.isPending)
        XCTAssertTrue(any.isPending, "any still waits for its live input")
        any.cancel(reason: TestError(6))
        assertCancelled(kept, reason: 6)
    }

    /// Dropping a settled chain releases it in a loop, each ancestor's retain of its parent
    /// taken before the ancestor itself dies; user code that runs meanwhile (here the
    /// deinit of a value) can still load an ancestor through a weak reference and keep it.
    /// That ancestor must then answer no parent, not the one the loop went on to free
    /// (reading that one's freed memory crashes this test, or worse).
    func testAncestorKeptDuringIterativeReleaseAnswersNoParent() {
        final class Resurrector: @unchecked Sendable {
            weak var target: AnyPromise?
            var kept: AnyPromise?
        }
        final class OnDeinit: Sendable {
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
            deinit { body() }
        }
        let resurrector = Resurrector()
        weak var weakRoot: Promise<Int>?
        var leaf: Promise<Int>?
        do {
            let root = Promise<Int>()
            let grandparent = root.then(on: .immediate) { $0 + 1 }
            let parent = grandparent.then(on: .immediate) { $0 + 1 }
            // Its value's deinit runs while the loop releases the chain, after `parent` has
            // been handed the loop and lost its retain of `grandparent`.
            let child = parent.then(on: .immediate) { _ in
                OnDeinit { resurrector.kept = resurrector.target }
            }
            leaf = child.then(on: .immediate) { _ in 1 }
            resurrector.target = parent
            weakRoot = root
            root.fulfill(0)
        }
        XCTAssertEqual(leaf?.state, .fulfilled)
        leaf = nil  // the loop releases child, parent, grandparent, root
        XCTAssertNil(weakRoot)
        guard let kept = resurrector.kept else { return XCTFail("the weak reference did not load") }
        XCTAssertNil(kept.parent)
        XCTAssertTrue(kept.root === kept)
        resurrector.kept = nil
    }

    /// `parent` and `root` read from many threads while the last reference to a pending
    /// parent (and to the middle of a chain) is dropped on another: every read answers the
    /// parent itself or nil, never anything else, nothing crashes (ASan and TSan runs check
    /// the memory side), and once the parent is gone every read answers nil.
    func testNavigationFromManyThreadsWhilePendingAncestorsAreReleased() {
        let readers = 4
        for round in 0..<200 {
            final class Holder: @unchecked Sendable {
                var promises: [AnyPromise]
                init(_ promises: [AnyPromise]) { self.promises = promises }
            }
            let top = Promise<Int>()
            let middle = top.then(on: .immediate) { $0 + 1 }
            // `.immediate`: broken on the thread where the top dies, so the readers do not
            // hold the pool's threads while the leaf waits for one.
            let leaf = middle.then(on: .immediate) { $0 + 1 }
            let topID = ObjectIdentifier(top), middleID = ObjectIdentifier(middle), leafID = ObjectIdentifier(leaf)
            weak let weakTop = top
            weak let weakMiddle = middle
            let holder = Holder([top, middle])
            _ = consume top
            _ = consume middle
            let wrongAnswers = Counter()
            let start = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for _ in 0..<readers {
                DispatchQueue.global().async(group: group) {
                    start.wait()
                    // Bounded: readers briefly keep the ancestors alive themselves.
                    for _ in 0..<10_000 {
                        let parent = leaf.parent
                        let root = leaf.root
                        if let parent, ObjectIdentifier(parent) != middleID { wrongAnswers.increment() }
                        let rootID = ObjectIdentifier(root)
                        if rootID != topID && rootID != middleID && rootID != leafID { wrongAnswers.increment() }
                        // Settled: broken by the top's death, its handler about to let
                        // the middle go.
                        if parent == nil || !leaf.isPending { break }
                    }
                }
            }
            for _ in 0..<readers { start.signal() }
            usleep(UInt32(round % 5) * 20)
            holder.promises = []  // the last references: the ancestors die here or in a reader
            XCTAssertEqual(group.wait(timeout: .now() + testTimeoutSeconds), .success)
            XCTAssertEqual(wrongAnswers.value, 0, "round \(round): a read answered another promise")
            settle(leaf)  // broken: the top died pending
            XCTAssertTrue(eventually { leaf.parent == nil && weakMiddle == nil }, "round \(round)")
            XCTAssertTrue(leaf.root === leaf, "round \(round)")
            XCTAssertNil(weakTop, "round \(round): the top leaked")
            XCTAssertNil(weakMiddle, "round \(round): the middle leaked")
            if wrongAnswers.value != 0 || weakTop != nil { return }
        }
    }

    func testAPendingRootDroppedWithObserversBreaksThemInOrderAndIsFreed() {
        // The first observer lives in the root itself (no retain of it: a promise must
        // not keep itself alive), the second in a box; onCancel must not run.
        weak var weakRoot: Promise<Int>?
        weak var weakFirst: Token?
        weak var weakSecond: Token?
        let ran = Recorder<Int>()
        do {
            let root = Promise<Int>()
            let first = Token(), second = Token()
            weakRoot = root
            weakFirst = first
            weakSecond = second
            root.whenComplete(on: .immediate) { result in
                if case .failure(PromiseError.brokenPromise) = result { ran.append(first.use(1)) }
            }
            root.onCancel { ran.append(0) }
            root.whenComplete(on: .immediate) { result in
                if case .failure(PromiseError.brokenPromise) = result { ran.append(second.use(2)) }
            }
        }
        XCTAssertNil(weakRoot, "a pending root with observers must be freed when dropped")
        XCTAssertNil(weakFirst, "the first observer (kept in the root) was not released")
        XCTAssertNil(weakSecond, "the second observer (in a box) was not released")
        XCTAssertEqual(ran.values, [1, 2], "the observers of a dropped promise get brokenPromise, in order; onCancel never")
    }

    func testAPendingRootDroppedWithAQueuedFirstObserverBreaksItOnItsQueue() {
        let queue = DispatchQueue(label: "PromiseTests.broken")
        let seen = Recorder<Bool>()
        do {
            Promise<Int>().whenComplete(on: queue) { result in
                dispatchPrecondition(condition: .onQueue(queue))
                if case .failure(PromiseError.brokenPromise) = result { seen.append(true) }
            }
        }
        queue.sync {}
        XCTAssertEqual(seen.values, [true])
    }

    func testAPendingRootDroppedWithADefaultContextFirstObserverBreaksItOffThisThread() {
        // `.default` is the one context the root's inline slot keeps (by its fire callback):
        // the moved observer must still run there, once.
        let caller = pthread_self()
        let seen = Recorder<Bool>()
        let ran = expectation(description: "the first observer ran")
        do {
            Promise<Int>().whenComplete { result in
                if case .failure(PromiseError.brokenPromise) = result { seen.append(pthread_equal(pthread_self(), caller) == 0) }
                ran.fulfill()
            }
        }
        wait(for: [ran], timeout: 10)
        XCTAssertEqual(seen.values, [true], "the observer of a dropped root gets brokenPromise on the default context")
    }

    /// Holds the only reference to a promise until a test takes it out.
    private final class RootHolder: @unchecked Sendable {
        private let lock = NSLock()
        private var promise: Promise<Int>?
        init(_ promise: Promise<Int>) { self.promise = promise }
        func peek() -> Promise<Int> { lock.lock(); defer { lock.unlock() }; return promise! }
        func takeOut() -> Promise<Int> { lock.lock(); defer { lock.unlock(); promise = nil }; return promise! }
    }

    func testAFirstObserverOutlivesTheSettlersReferenceUntilItRan() {
        // The only reference to the root is dropped inside the settle (by the observer
        // before it), while the first observer still waits on the trampoline or the queue.
        let queue = DispatchQueue(label: "PromiseTests.first-observer-lifetime")
        for context: any ExecutionContext in [ImmediateExecutionContext.immediate, queue] {
            let seen = Recorder<Int>()
            let outer = Promise<Int>()
            let holder = RootHolder(Promise<Int>())
            holder.peek().whenComplete(on: context) { result in
                if case .success(let v) = result { seen.append(v) }
            }
            outer.whenComplete(on: .immediate) { _ in
                holder.takeOut().fulfill(9)  // the root goes away when this observer returns
            }
            outer.fulfill(0)
            queue.sync {}
            XCTAssertEqual(seen.values, [9], "on \(type(of: context))")
        }
    }

    // MARK: A promise keeps nothing above it

    func testSettledChildLetsItsSettledParentGo() {
        weak var weakParent: Promise<Int>?
        let child: Promise<Int>
        do {
            let parent = Promise<Int>()
            weakParent = parent
            child = parent.then(on: .immediate) { $0 * 2 }
            parent.fulfill(4)
            XCTAssertTrue(child.parent === parent, "a parent someone holds answers")
        }
        XCTAssertNil(weakParent, "the settled child kept its settled parent alive")
        XCTAssertNil(child.parent)
        XCTAssertTrue(child.root === child, "with its parent gone, the child is the top of its tree")
        XCTAssertEqual(value(child), 8)
    }

    func testChildOnQueueHoldsItsParentUntilItsHandlerRan() {
        weak var weakParent: Promise<Int>?
        let queue = heldQueue()
        let child: Promise<Int>
        do {
            let parent = Promise<Int>()
            weakParent = parent
            child = parent.then(on: queue) { $0 * 2 }
            parent.fulfill(5)
        }
        // The handler has not run yet: it still needs the parent's value.
        XCTAssertNotNil(weakParent, "a child in flight let its parent go before its handler ran")
        XCTAssertTrue(child.parent === weakParent)
        queue.resume()
        XCTAssertEqual(value(child), 10)
        XCTAssertTrue(eventually { weakParent == nil }, "the child kept its parent after its handler ran")
        XCTAssertNil(child.parent)
    }

    func testFollowerLetsItsParentGoOnceItsHandlerRan() {
        weak var weakParent: Promise<Int>?
        let followed = Promise<Int>()
        let child: Promise<Int>
        do {
            let parent = Promise<Int>()
            weakParent = parent
            child = parent.flatMap(on: .immediate) { _ in followed }
            parent.fulfill(1)
        }
        XCTAssertNil(weakParent, "a follower kept its parent while following")
        followed.fulfill(7)
        XCTAssertEqual(value(child), 7)
    }

    /// The retention rule a server meets: a cached `download().then { summarize($0) }` must
    /// not keep the download. A 100,000-step chain from a root fulfilled with a 50 MB value:
    /// once it settled, holding the leaf keeps neither the value nor any step above it
    /// (the bytes it keeps are measured, beside SwiftNIO, by the benchmarks' memory cases).
    func testSettledLeafOfLongChainKeepsNeitherRootNorItsValue() {
        runInChildProcess {
            let tracker = LifeTracker()
            weak var weakRoot: Promise<Payload>?
            weak var weakMiddle: Promise<Int>?
            let leaf: Promise<Int>
            do {
                let root = Promise<Payload>()
                weakRoot = root
                var step = root.then(on: .immediate) { $0.bytes.count }
                weakMiddle = step
                for _ in 0..<100_000 { step = step.then(on: .immediate) { $0 &+ 1 } }
                leaf = step
                root.fulfill(Payload(bytes: [UInt8](repeating: 1, count: 50_000_000), tracker: tracker))
            }
            XCTAssertEqual(value(leaf), 50_000_000 &+ 100_000)
            XCTAssertNil(weakRoot, "the settled leaf kept the root alive")
            XCTAssertNil(weakMiddle, "the settled leaf kept a step above it alive")
            XCTAssertEqual(tracker.alive, 0, "the settled leaf kept the root's value alive")
            withExtendedLifetime(leaf) {}
        }
    }

    func testDroppingChildFreesItsSettledAncestors() {
        weak var weakRoot: Promise<Int>?
        weak var weakChild: Promise<Int>?
        do {
            let root = Promise<Int>()
            weakRoot = root
            var child: Promise<Int>? = root.then(on: .immediate) { $0 }.then(on: .immediate) { $0 }
            weakChild = child
            root.fulfill(1)
            XCTAssertNotNil(child)
            child = nil
        }
        XCTAssertNil(weakChild)
        XCTAssertNil(weakRoot)
    }

    // MARK: Timers let go when they are no longer needed

    /// A value whose freeing a test can watch.
    private final class WatchedValue: Sendable {}

    func testSettledTimeoutOutputIsFreedBeforeItsDeadline() {
        weak var weakChild: Promise<WatchedValue>?
        weak var weakValue: WatchedValue?
        do {
            let source = Promise<WatchedValue>()
            let child = source.timeout(.seconds(60))
            weakChild = child
            let value = WatchedValue()
            weakValue = value
            source.fulfill(value)
            XCTAssertTrue(eventually { child.isFulfilled })
        }
        // The timer was cancelled when the child settled: its box let go of the child now,
        // not in a minute.
        XCTAssertTrue(eventually { weakChild == nil && weakValue == nil },
                      "a settled timeout output was kept until its deadline")
    }

    func testCancelledDelayOutputIsFreedBeforeItsDeadline() {
        weak var weakChild: Promise<WatchedValue>?
        weak var weakValue: WatchedValue?
        do {
            let value = WatchedValue()
            weakValue = value
            let source = Promise(value: value)
            // The source is fulfilled, so the delay's timer starts inside `delay` (its
            // hand-off runs on `.immediate`).
            let child = source.delay(.seconds(60))
            weakChild = child
            XCTAssertTrue(child.isPending)
            child.cancel()
            XCTAssertTrue(child.isCancelled)
        }
        XCTAssertTrue(eventually { weakChild == nil && weakValue == nil },
                      "a cancelled delay output, or its value, was kept until the deadline")
    }

    func testCancelledAfterIsFreedBeforeItsDeadline() {
        weak var weakTimer: Promise<Void>?
        do {
            let timer = Promise.after(.seconds(60))
            weakTimer = timer
            timer.cancel()
        }
        XCTAssertTrue(eventually { weakTimer == nil }, "a cancelled after() was kept until its deadline")
    }

    func testAfterSettledFromOutsideIsFreedBeforeItsDeadline() {
        weak var weakTimer: Promise<Void>?
        do {
            let timer = Promise.after(.seconds(60))
            weakTimer = timer
            timer.reject(PromiseError.timedOut)  // an outside resolver wins, as with any pending promise
        }
        XCTAssertTrue(eventually { weakTimer == nil }, "an after() settled from outside was kept until its deadline")
    }

    // MARK: Stack safety
    //
    // Each of these runs in a child process (see `runInChildProcess`): a stack overflow
    // then fails that one test instead of killing the whole run.

    func testImmediateChainOf100000StepsSettles() {
        runInChildProcess {
            let root = Promise<Int>()
            var p = root
            for _ in 0..<100_000 { p = p.then(on: .immediate) { $0 + 1 } }
            root.fulfill(0)
            XCTAssertEqual(p.state, .fulfilled, "the chain did not settle before fulfill returned")
            XCTAssertEqual(value(p), 100_000)
        }
    }

    func testImmediateChainOnSettledRootSettlesWhileBeingBuilt() {
        runInChildProcess {
            var p = Promise(value: 0)
            for _ in 0..<100_000 { p = p.then(on: .immediate) { $0 + 1 } }
            XCTAssertEqual(value(p), 100_000)
        }
    }

    func testImmediateFlatMapChainOf100000StepsSettles() {
        runInChildProcess {
            let root = Promise<Int>()
            var p = root
            for _ in 0..<100_000 { p = p.flatMap(on: .immediate) { Promise(value: $0 + 1) } }
            root.fulfill(0)
            XCTAssertEqual(value(p), 100_000)
        }
    }

    func testImmediateRecoverChainOf100000RejectionsSettles() {
        runInChildProcess {
            let root = Promise<Int>()
            var p = root
            for _ in 0..<100_000 { p = p.recover(on: .immediate) { e -> Int in throw e } }
            let end = p.recover(on: .immediate) { e in (e as? TestError)?.id ?? -1 }
            root.reject(TestError(3))
            XCTAssertEqual(value(end), 3)
        }
    }

    /// Combinators nested directly (each one's output the input of the next): an input's
    /// slot settles its output from the trampoline, not from inside the input's firing,
    /// so the outcome climbs 100,000 levels in constant stack depth. Before, each level
    /// fired the next one's slot a frame deeper: 20,000 levels of `race` overflowed.
    /// (`race` and `any` keep their type as they nest; the others wrap it.)
    func testDirectlyNestedCombinatorsOf100000LevelsSettle() {
        runInChildProcess {
            let leaf = Promise<Int>()
            var race = leaf, any = leaf
            for _ in 0..<100_000 {
                race = Promise.race([race])
                any = Promise.any([any])
            }
            leaf.fulfill(5)
            XCTAssertEqual(race.state, .fulfilled, "the nesting did not settle before fulfill returned")
            XCTAssertEqual(value(race), 5)
            XCTAssertEqual(value(any), 5)
        }
    }

    /// The same nesting dropped whole, pending: each level dies or breaks in turn, in
    /// constant stack depth (before, 10,000 levels overflowed).
    func testDroppingDirectlyNestedCombinatorsPendingDoesNotCrash() {
        runInChildProcess {
            weak var weakTop: Promise<Int>?
            do {
                let leaf = Promise<Int>()
                var top = leaf
                for _ in 0..<100_000 { top = Promise.race([top]) }
                weakTop = top
                withExtendedLifetime(leaf) {}  // the leaf goes last: its break climbs the nesting
            }
            XCTAssertNil(weakTop, "the nesting outlived its last holder")
        }
    }

    /// The same nesting, its leaf dropped pending: the broken promise climbs every level.
    func testDirectlyNestedCombinatorsOverADroppedLeafBreakEveryLevel() throws {
        try runInChildProcess {
            let top: Promise<Int> = {  // the leaf's one holder goes as this returns
                let leaf = Promise<Int>()
                var top = leaf
                for _ in 0..<100_000 { top = Promise.race([top]) }
                withExtendedLifetime(leaf) {}
                return top
            }()
            XCTAssertThrowsError(try top.wait(timeout: .seconds(30))) {
                guard case PromiseError.brokenPromise = $0 else { return XCTFail("\($0)") }
            }
        }
    }

    func testCancellingRootOf100000StepPendingChainCancelsItAll() {
        runInChildProcess {
            let root = Promise<Int>()
            var p = root
            for _ in 0..<100_000 { p = p.then { $0 + 1 } }
            root.cancel(reason: TestError(4))
            assertCancelled(p, reason: 4)
        }
    }

    func testReleasingPending1000000StepChainDoesNotCrash() {
        runInChildProcess {
            weak var weakLeaf: Promise<Int>?
            do {
                let root = Promise<Int>()
                var p = root
                for _ in 0..<deepLevels(1_000_000) { p = p.then(on: .immediate) { $0 + 1 } }
                weakLeaf = p
            }
            XCTAssertNil(weakLeaf)
        }
    }

    func testReleasingSettled1000000StepChainDoesNotCrash() {
        runInChildProcess {
            weak var weakRoot: Promise<Int>?
            do {
                var root: Promise<Int>? = Promise<Int>()
                weakRoot = root
                var p = root!
                let levels = deepLevels(1_000_000)
                for _ in 0..<levels { p = p.then(on: .immediate) { $0 + 1 } }
                root?.fulfill(0)
                root = nil
                XCTAssertEqual(value(p), levels)
                // Each step let its parent go once its handler ran: only the leaf is left.
                XCTAssertNil(weakRoot)
            }
            XCTAssertNil(weakRoot)
        }
    }

    func testLongResolveWithChainOf100000PromisesSettles() {
        runInChildProcess {
            // p[i] follows p[i + 1]; settling the last settles the first.
            let count = 100_000
            let chain = (0..<count).map { _ in Promise<Int>() }
            for i in 0..<(count - 1) { chain[i].resolve(with: chain[i + 1]) }
            chain[count - 1].fulfill(42)
            XCTAssertEqual(chain[0].state, .fulfilled)
            XCTAssertEqual(value(chain[0]), 42)
        }
    }

    func testLongResolveWithChainFollowingBackwardsSettles() {
        runInChildProcess {
            // p[i + 1] follows p[i], built from the already settled end.
            var p = Promise(value: 7)
            for _ in 0..<100_000 {
                let next = Promise<Int>()
                next.resolve(with: p)
                p = next
            }
            XCTAssertEqual(value(p), 7)
        }
    }

    func testReleasingPendingResolveWithChainOf100000PromisesDoesNotCrash() {
        runInChildProcess {
            weak var weakFirst: Promise<Int>?
            do {
                let first = Promise<Int>()
                weakFirst = first
                var p = first
                for _ in 0..<100_000 {
                    let next = Promise<Int>()
                    p.resolve(with: next)  // `next` holds `p` (its observer) until it settles
                    p = next
                }
            }
            XCTAssertNil(weakFirst)
        }
    }
}
