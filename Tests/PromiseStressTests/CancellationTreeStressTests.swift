// Cancellation trees built and cancelled from several threads at once: two builders
// grow a tree under one root (attaching children of every form, on several contexts, to
// random nodes, also to nodes that have already settled or been cancelled), a canceller
// cancels inner nodes and, in two of three rounds, the root, and a settler fulfils the
// root in two of three rounds. Every round checks, node by node:
//   - every node settles (none lost);
//   - a fulfilled node has its parent fulfilled and the value its path computes;
//   - a cancelled node carries the reason of a cancel applied to itself or an ancestor:
//     cancellation flows down, never up or sideways (a node with no cancelled ancestor is
//     fulfilled, the root included when only inner nodes were cancelled);
//   - no node is rejected;
//   - a handler with an error side whose parent ended cancelled ran exactly once with
//     that reason; success handlers never ran on a cancelled parent, and at most once
//     with the parent's value otherwise (exactly once if they produced the node's value);
//   - a cancel reaches every descendant in flight: some nodes run on a *held* queue, kept
//     suspended until the round is otherwise quiet, so their handlers cannot run before
//     any cancel returned; a held node that existed before a cancel of its ancestor began
//     must end cancelled, never fulfilled. Nor may any other node whose handler started
//     only after such a cancel returned (an `.immediate` one included: its handler runs
//     on a racing thread while the cancel, on another, finds it in no registry).
import Dispatch
import Foundation
import Promise
import Synchronization
import XCTest

/// Counts the blocks a round's contexts have queued and not finished, so the test can
/// tell when the library has nothing left in flight (no linking, no forwarding).
private final class InFlight: Sendable {
    let count = Atomic<Int>(0)
}

/// Forwards to `base`, counting the block while it is queued or running.
private struct TrackedContext: ExecutionContext {
    let base: any ExecutionContext
    let inFlight: InFlight

    func execute(_ work: @escaping @Sendable () -> Void) {
        inFlight.count.add(1, ordering: .relaxed)
        let inFlight = self.inFlight
        base.execute {
            work()
            inFlight.count.subtract(1, ordering: .releasing)
        }
    }
}

final class CancellationTreeStressTests: XCTestCase {
    private struct Node: Sendable {
        let index: Int
        let parent: Int
        let form: Form
        let context: ContextKind
        /// Runs on the round's held queue (`context` is then `.serial`).
        let held: Bool
        let promise: Promise<Int>
        let probe: Probe?
        /// A tick taken after the registering call returned.
        let registeredAt: Int
    }

    /// One cancel call, with ticks taken just before and just after it.
    private struct Cancel {
        let node: Int
        let reason: Int
        let start: Int
        let end: Int
    }

    /// The child forms a tree is built from, and what each adds to a fulfilled value.
    private static let forms: [(Form, Int)] = [
        (.thenMap, 1), (.map, 1), (.thenFlat, 2), (.flatMap, 2), (.thenBoth, 3),
        (.recover, 0), (.recoverFlat, 0), (.catchError, 0), (.always, 0), (.mapError, 0),
    ]
    /// Contexts nodes run on; nil stands for the round's held queue.
    private static let contexts: [ContextKind?] = [.immediate, .standard, .serial, .concurrent, .custom, .main,
                                                   .immediate, nil, nil, nil, nil]

    private static func delta(of form: Form) -> Int {
        forms.first { $0.0 == form }?.1 ?? 0
    }

    func testTreesBuiltAndCancelledFromSeveralThreads() {
        let builders = 2
        let perBuilder = 12
        let crew = Crew(size: builders + 2)
        let cancellerSeat = builders, settlerSeat = builders + 1
        defer { crew.stop() }
        let log = ViolationLog()
        let inFlight = InFlight()
        var nodesChecked = 0, fulfilledNodes = 0, cancelledNodes = 0, cleanUps = 0, heldNodesReached = 0
        var rootsFulfilled = 0, rootsCancelled = 0, lateChildren = 0, lateImmediate = 0, lateQueued = 0

        runStressRounds("cancellation trees", invariants: [
            "every node settles (none lost)", "fulfilled nodes carry their path's value",
            "cancel flows down, never up or sideways", "no node rejected",
            "error sides run exactly once on a cancelled parent", "success handlers at most once, never on a cancelled parent",
            "handlers off the racing threads unless .immediate",
            "a cancel reaches every descendant in flight (held nodes end cancelled)",
        ], details: {
            "\(nodesChecked) nodes checked: \(fulfilledNodes) fulfilled, \(cancelledNodes) cancelled; "
                + "roots fulfilled \(rootsFulfilled), cancelled \(rootsCancelled); clean-up handlers run \(cleanUps); "
                + "children attached to an already cancelled parent \(lateChildren); held nodes a cancel had to reach "
                + "\(heldNodesReached); nodes whose handler started after a cancel of their ancestor had returned "
                + "(each must end cancelled): .immediate \(lateImmediate), queued \(lateQueued)"
        }) { checker in
            let round = checker.round
            let kind = round % 3  // 0: inner cancels only; 1: root fulfil races root cancel; 2: root only cancelled
            let rootValue = 1_000 + round
            let root = Promise<Int>()
            let heldQueue = DispatchQueue(label: "PromiseStressTests.held")
            heldQueue.suspend()
            var heldResumed = false
            defer { if !heldResumed { heldQueue.resume() } }  // a suspended queue must not be released
            let tree = Locked<[Node]>([Node(index: 0, parent: -1, form: .thenMap, context: .immediate, held: false,
                                            promise: root, probe: nil, registeredAt: 0)])
            let cancels = SeatBox<Cancel>()
            let lateBox = (0..<builders).map { _ in SeatBox<Int>() }
            let tracked = TrackedContext(base: .default, inFlight: inFlight)

            let finished = crew.play { seat in
                var random = StressRandom(round: round, seat: seat)
                crew.barrier.arriveAndWait()
                switch seat {
                case settlerSeat:
                    guard kind != 2 else { return }
                    spin(random.below(4_000))
                    root.fulfill(rootValue)
                case cancellerSeat:
                    for step in 0..<2 {
                        spin(random.below(3_000))
                        let target = tree.withLock { nodes in nodes.count > 1 ? nodes[1 + random.below(nodes.count - 1)] : nil }
                        if let target {
                            let reason = 100 + step
                            let start = Probe.tick()
                            target.promise.cancel(reason: StressError(id: reason))
                            cancels.items.append(Cancel(node: target.index, reason: reason, start: start, end: Probe.tick()))
                        }
                    }
                    if kind != 0 {
                        spin(random.below(3_000))
                        let start = Probe.tick()
                        root.cancel(reason: StressError(id: 1))
                        cancels.items.append(Cancel(node: 0, reason: 1, start: start, end: Probe.tick()))
                    }
                default:
                    for _ in 0..<perBuilder {
                        let parent = tree.withLock { nodes in nodes[random.below(nodes.count)] }
                        let (form, _) = CancellationTreeStressTests.forms[random.below(CancellationTreeStressTests.forms.count)]
                        let choice = CancellationTreeStressTests.contexts[random.below(CancellationTreeStressTests.contexts.count)]
                        let kindOfContext = choice ?? .serial
                        let context: any ExecutionContext = choice == nil ? heldQueue
                            : kindOfContext == .immediate ? .immediate
                            : TrackedContext(base: kindOfContext.context, inFlight: inFlight)
                        let probe = Probe(log: log)
                        if parent.promise.isCancelled { lateBox[seat].items.append(1) }
                        guard let child = register(form, on: parent.promise, in: context, followOn: tracked, probe: probe)
                        else { continue }
                        let registeredAt = Probe.tick()
                        tree.withLock { nodes in
                            nodes.append(Node(index: nodes.count, parent: parent.index, form: form, context: kindOfContext,
                                              held: choice == nil, promise: child, probe: probe, registeredAt: registeredAt))
                        }
                        spin(random.below(300))
                    }
                }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }
            let nodes = tree.withLock { $0 }
            lateChildren += lateBox.reduce(0) { $0 + $1.items.count }
            var underHeld = [Bool](repeating: false, count: nodes.count)
            for node in nodes.dropFirst() { underHeld[node.index] = node.held || underHeld[node.parent] }

            // Phase 1: everything but the held queue comes to rest (no block in flight on
            // any context, twice in a row, and every node outside the held subtrees settled).
            // Whatever linking or forwarding the cancels started has then finished.
            var quietPolls = 0
            let quiet = pumpMainRunLoop {
                let idle = inFlight.count.load(ordering: .acquiring) == 0
                    && nodes.allSatisfy { underHeld[$0.index] || !$0.promise.isPending }
                quietPolls = idle ? quietPolls + 1 : 0
                return quietPolls >= 2
            }
            // Phase 2: let the held handlers run, then wait for every node and every clean-up
            // handler that must run.
            heldQueue.resume()
            heldResumed = true
            func mustRunOnce(_ node: Node) -> Bool {
                node.form.hasErrorSide && nodes[node.parent].promise.isCancelled
            }
            let rested = quiet && pumpMainRunLoop {
                nodes.allSatisfy { node in
                    !node.promise.isPending && (node.index == 0 || !mustRunOnce(node) || (node.probe?.runs ?? 0) >= 1)
                }
            }
            guard rested else {
                let stuck = nodes.filter { $0.promise.isPending }
                checker.fail("\(quiet ? "" : "the contexts never went quiet; ")\(stuck.count) nodes never settled (lost), e.g. "
                             + stuck.prefix(3).map { "\($0.form) on \($0.held ? "held queue" : "\($0.context)") under node "
                                 + "\($0.parent) (\(Settled(nodes[$0.parent].promise)))" }.joined(separator: "; "))
                return false
            }

            // The reasons that may reach each node: cancels of itself and its ancestors.
            var reasonsOn = [Set<Int>](repeating: [], count: nodes.count)
            for cancel in cancels.items { reasonsOn[cancel.node].insert(cancel.reason) }
            var expectedValue = [Int](repeating: 0, count: nodes.count)
            expectedValue[0] = rootValue
            var onPath = [Set<Int>](repeating: [], count: nodes.count)
            onPath[0] = reasonsOn[0]
            for node in nodes.dropFirst() {  // parents come before their children
                onPath[node.index] = onPath[node.parent].union(reasonsOn[node.index])
                expectedValue[node.index] = expectedValue[node.parent] + CancellationTreeStressTests.delta(of: node.form)
            }

            let rootFinal = Settled(root)
            switch kind {
            case 0: checker.check(rootFinal == .fulfilled(rootValue), "root ended \(rootFinal): a cancel of an inner node flowed up")
            case 1: checker.check(rootFinal == .fulfilled(rootValue) || rootFinal == .cancelled(.stress(1)), "root ended \(rootFinal)")
            default: checker.check(rootFinal == .cancelled(.stress(1)), "root ended \(rootFinal), expected cancelled(E1)")
            }
            if case .fulfilled = rootFinal { rootsFulfilled += 1 } else { rootsCancelled += 1 }

            for node in nodes.dropFirst() {
                let final = Settled(node.promise)
                let parentFinal = Settled(nodes[node.parent].promise)
                let what = "node \(node.index) (\(node.form) on \(node.held ? "held queue" : "\(node.context)") "
                    + "under node \(node.parent) that ended \(parentFinal))"
                nodesChecked += 1
                switch final {
                case .pending:
                    checker.fail("\(what) is still pending")
                case .fulfilled(let v):
                    fulfilledNodes += 1
                    checker.check(v == expectedValue[node.index], "\(what): fulfilled with \(v), its path computes \(expectedValue[node.index])")
                    checker.check(parentFinal == .fulfilled(expectedValue[node.parent]), "\(what): fulfilled although its parent did not")
                case .cancelled(let tag):
                    cancelledNodes += 1
                    if case .stress(let id) = tag {
                        checker.check(onPath[node.index].contains(id),
                                      "\(what): cancelled with E\(id), which was applied to none of its ancestors "
                                          + "(cancels: \(cancels.items.map { "E\($0.reason) on node \($0.node)" })): "
                                          + "cancellation flowed up or sideways")
                    } else {
                        checker.fail("\(what): cancelled with \(tag)")
                    }
                case .rejected(let tag):
                    checker.fail("\(what): rejected with \(tag), but nothing in the tree rejects")
                }

                guard let probe = node.probe else { continue }
                let record = probe.snapshot
                var maxRuns = 0
                var expectedSeen: Seen?
                switch parentFinal {
                case .cancelled(let tag):
                    if node.form.hasErrorSide {
                        expectedSeen = node.form == .always ? .nothing : .error(tag)
                        maxRuns = 1
                        checker.check(record.runs == 1, "\(what): clean-up handler ran \(record.runs) times, expected once")
                        cleanUps += record.runs
                    } else {
                        checker.check(record.runs == 0, "\(what): success handler ran on a cancelled parent")
                    }
                case .fulfilled(let pv):
                    let successSide = [.thenMap, .map, .thenFlat, .flatMap, .thenBoth, .always].contains(node.form)
                    if successSide {
                        expectedSeen = node.form == .always ? .nothing : .value(pv)
                        maxRuns = 1
                        checker.check(record.runs <= 1, "\(what): ran \(record.runs) times")
                        if case .fulfilled = final {
                            checker.check(record.runs == 1, "\(what): fulfilled without its handler running")
                        }
                    } else {
                        checker.check(record.runs == 0, "\(what): error handler ran on a fulfilled parent")
                    }
                default:
                    checker.check(record.runs == 0, "\(what): ran on a parent that ended \(parentFinal)")
                }
                if record.runs > 0 {
                    checker.check(record.seen == expectedSeen,
                                  "\(what): saw \(record.seen.map(String.init(describing:)) ?? "-"), expected \(expectedSeen.map(String.init(describing:)) ?? "-")")
                    if node.context != .immediate {
                        checker.check(record.seat == nil, "\(what): ran on racing seat \(record.seat ?? -1)")
                    }
                }
                probe.seal(maxRuns: maxRuns, expected: expectedSeen, label: what)
            }

            // A cancel reaches every descendant still in flight. Held nodes are the sharp
            // check: their handlers ran only after every cancel had returned and the round
            // had gone quiet, so one that existed before a cancel of its ancestor began must
            // end cancelled. So must any other node whose handler started only after such a
            // cancel returned: its outcome cannot have been decided before the cancel.
            for cancel in cancels.items {
                for node in nodes.dropFirst() where node.registeredAt < cancel.start {
                    var ancestor = node.index
                    while ancestor > 0 && ancestor != cancel.node { ancestor = nodes[ancestor].parent }
                    guard ancestor == cancel.node else { continue }
                    let final = Settled(node.promise)
                    if node.held {
                        heldNodesReached += 1
                        if case .fulfilled = final {
                            checker.fail("node \(node.index) (\(node.form) on the held queue) existed before E\(cancel.reason) "
                                         + "cancelled node \(cancel.node), yet it ended fulfilled: the cancel never reached it")
                        }
                        continue
                    }
                    guard let probe = node.probe else { continue }
                    let record = probe.snapshot
                    guard record.runs > 0, record.sequence > cancel.end else { continue }
                    if node.context == .immediate { lateImmediate += 1 } else { lateQueued += 1 }
                    if case .fulfilled = final {
                        checker.fail("node \(node.index) (\(node.form) on \(node.context)) existed before E\(cancel.reason) "
                                     + "cancelled node \(cancel.node), yet its handler started after that cancel returned "
                                     + "and fulfilled it")
                    }
                }
            }
            checker.check(log.count == 0, "violations: \(log.first)")
            return true
        }
        drainContexts()
        XCTAssertEqual(log.count, 0, "handlers that ran after their round was checked: \(log.first)")
    }
}
