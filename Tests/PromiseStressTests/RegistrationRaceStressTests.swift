// Many threads register continuations of every form, on every context, on the same
// pending promises while other threads race to fulfil, reject, resolve (and, in the
// second test, cancel) them. Every round checks: exactly one outcome wins, and every
// resolver that reports a result reports the truth; every handler runs exactly once
// (or, where the API allows it, at most once), sees the winning outcome, on the context
// it asked for; every child settles as the table in StressForms.swift says; none is lost.
import Dispatch
import Foundation
import Promise
import XCTest

final class RegistrationRaceStressTests: XCTestCase {
    func testResolversRaceWhileEveryFormRegistersOnEveryContext() {
        race(name: "registration vs racing resolvers", withCancellers: false)
    }

    /// With cancellers in the race. A cancel that loses to a fulfil or reject still
    /// flows down to children whose handler has not run yet (the API's rule), so those
    /// children may end cancelled with the losing canceller's reason instead, and their
    /// handlers run at most once; observers that are not children stay exact.
    func testResolversAndCancellersRaceWhileEveryFormRegisters() {
        race(name: "registration vs racing resolvers and cancellers", withCancellers: true)
    }
}

private enum ResolverAction: CaseIterable, CustomStringConvertible {
    case fulfill, reject, resolveSuccess, resolveFailure, resolveWith, cancel

    var description: String {
        switch self {
        case .fulfill: return "fulfill"
        case .reject: return "reject"
        case .resolveSuccess: return "resolve(.success)"
        case .resolveFailure: return "resolve(.failure)"
        case .resolveWith: return "resolve(with:)"
        case .cancel: return "cancel(reason:)"
        }
    }
}

/// One settler's try at one promise.
private struct Attempt {
    let seat: Int
    let promise: Int
    let action: ResolverAction
    /// The outcome this attempt produces if it wins (payloads name seat and promise).
    let outcome: Settled
    /// What the call returned, for the calls that return whether they won.
    var returned: Bool?
}

private struct Registration {
    let seat: Int
    let promise: Int
    let form: Form
    let context: ContextKind
    let probe: Probe
    let child: Promise<Int>?
}

private let registrars = 3
private let settlers = 3
private let promisesPerRound = 3
private let registrationsPerPromise = 6

extension RegistrationRaceStressTests {
    private func race(name: String, withCancellers: Bool) {
        let crew = Crew(size: registrars + settlers)
        defer { crew.stop() }
        let log = ViolationLog()
        let actions = withCancellers ? ResolverAction.allCases : ResolverAction.allCases.filter { $0 != .cancel }
        var wins: [String: Int] = [:]
        var immediateBySettler = 0, immediateInline = 0, roundsWithBoth = 0, relaxedChildren = 0
        var registrationsChecked = 0

        runStressRounds(name, invariants: [
            "exactly one outcome wins", "resolvers report the truth",
            withCancellers ? "each handler once (children of a lost cancel: at most once)" : "each handler exactly once",
            "handlers see the winning outcome", "children settle as specified", "none lost",
            "handlers run on their context (.immediate: settler or registrar; others: never on a racing thread)",
            "wait() returns the outcome",
        ], details: {
            "wins by action \(wins.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")); "
                + "\(registrationsChecked) registrations checked; .immediate handlers run by the settler "
                + "\(immediateBySettler), inline at registration \(immediateInline), rounds with both \(roundsWithBoth)"
                + (withCancellers ? "; children cancelled by a losing cancel \(relaxedChildren)" : "")
        }) { checker in
            let round = checker.round
            let promises = (0..<promisesPerRound).map { _ in Promise<Int>() }
            let registrationBoxes = (0..<registrars).map { _ in SeatBox<Registration>() }
            let attemptBoxes = (0..<settlers).map { _ in SeatBox<Attempt>() }
            let waitBox = SeatBox<Seen>()

            let finished = crew.play { seat in
                crew.barrier.arriveAndWait()
                if seat < registrars {
                    let box = registrationBoxes[seat]
                    for i in 0..<registrationsPerPromise {
                        for k in 0..<promisesPerRound {
                            let form = Form.allCases[(round + seat * 5 + i * 3 + k) % Form.allCases.count]
                            let context = ContextKind.allCases[(round * 7 + seat * 3 + i + k * 5) % ContextKind.allCases.count]
                            let probe = Probe(log: log)
                            let child = register(form, on: promises[k], context: context, probe: probe)
                            box.items.append(Registration(seat: seat, promise: k, form: form, context: context,
                                                          probe: probe, child: child))
                        }
                    }
                    if seat == 0 {
                        // Blocking is one more way to observe: it must see the same outcome.
                        do {
                            waitBox.items.append(.value(try promises[round % promisesPerRound].wait(timeout: .seconds(StressConfiguration.roundTimeout / 2))))
                        } catch {
                            waitBox.items.append(.error(ErrorTag(error)))
                        }
                    }
                } else {
                    var random = StressRandom(round: round, seat: seat)
                    let box = attemptBoxes[seat - registrars]
                    spin(random.below(3_000))
                    for j in 0..<promisesPerRound {
                        let k = (j + seat + round) % promisesPerRound
                        let action = actions[(round + seat * 2 + k) % actions.count]
                        let value = seat * 100 + k + 1
                        let errorID = 1_000 + seat * 100 + k
                        let cancelID = 2_000 + seat * 100 + k
                        let promise = promises[k]
                        var attempt: Attempt
                        switch action {
                        case .fulfill:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .fulfilled(value))
                            attempt.returned = promise.fulfill(value)
                        case .reject:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .rejected(.stress(errorID)))
                            attempt.returned = promise.reject(StressError(id: errorID))
                        case .resolveSuccess:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .fulfilled(value))
                            attempt.returned = promise.resolve(.success(value))
                        case .resolveFailure:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .rejected(.stress(errorID)))
                            attempt.returned = promise.resolve(.failure(StressError(id: errorID)))
                        case .resolveWith:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .fulfilled(value))
                            promise.resolve(with: Promise(value: value))
                        case .cancel:
                            attempt = Attempt(seat: seat, promise: k, action: action, outcome: .cancelled(.stress(cancelID)))
                            promise.cancel(reason: StressError(id: cancelID))
                        }
                        box.items.append(attempt)
                        spin(random.below(800))
                    }
                }
            }
            guard finished else {
                checker.fail("the crew did not finish within \(StressConfiguration.roundTimeout)s (deadlock?)")
                return false
            }

            // Exactly one outcome wins each promise, and the calls that say so tell the truth.
            let attempts = attemptBoxes.flatMap(\.items)
            var outcome: [Settled] = []
            var winnerSeat: [Int] = []
            var cancelTags: [[ErrorTag]] = []
            for k in 0..<promisesPerRound {
                let final = Settled(promises[k])
                outcome.append(final)
                let tries = attempts.filter { $0.promise == k }
                checker.check(!final.isPending, "promise \(k) is still pending after \(tries.map(\.action))")
                let winners = tries.filter { $0.outcome == final }
                checker.check(winners.count == 1,
                              "promise \(k) ended \(final); attempts \(tries.map { "\($0.action) -> \($0.outcome)" }): "
                                  + "\(winners.count) of them match")
                let winner = winners.first
                winnerSeat.append(winner?.seat ?? -1)
                if let winner { wins[winner.action.description, default: 0] += 1 }
                for attempt in tries {
                    guard let returned = attempt.returned else { continue }
                    checker.check(returned == (attempt.seat == winner?.seat),
                                  "promise \(k): \(attempt.action) on seat \(attempt.seat) returned \(returned), "
                                      + "but the promise ended \(final)")
                }
                cancelTags.append(tries.compactMap { attempt in
                    if case .cancelled(let tag) = attempt.outcome { return tag }
                    return nil
                })
            }
            if checker.failures > 0 { return true }

            let registrations = registrationBoxes.flatMap(\.items)
            registrationsChecked += registrations.count
            func cancelLost(_ k: Int) -> Bool {
                guard !cancelTags[k].isEmpty else { return false }
                if case .cancelled = outcome[k] { return false }
                return true
            }
            // Wait for the round to come to rest: every child settled, every handler
            // that must run has run.
            let rested = pumpMainRunLoop {
                registrations.allSatisfy { r in
                    if let child = r.child, child.isPending { return false }
                    if r.form.hasChild && cancelLost(r.promise) { return true }
                    return r.probe.runs >= outcomeTable(r.form, after: outcome[r.promise]).runs
                }
            }
            if !rested {
                let stuck = registrations.filter { r in
                    (r.child?.isPending ?? false)
                        || (!(r.form.hasChild && cancelLost(r.promise))
                            && r.probe.runs < outcomeTable(r.form, after: outcome[r.promise]).runs)
                }
                checker.fail("\(stuck.count) registrations never completed (lost), e.g. "
                             + stuck.prefix(3).map { "\($0.form) on \($0.context) of promise \($0.promise) (\(outcome[$0.promise]))" }
                                 .joined(separator: "; "))
                return false
            }

            var bySettler = 0, inline = 0
            for r in registrations {
                let final = outcome[r.promise]
                let expected = outcomeTable(r.form, after: final)
                let record = r.probe.snapshot
                let what = "\(r.form) on \(r.context), registered by seat \(r.seat) on promise \(r.promise) that ended \(final)"
                let relaxed = r.form.hasChild && cancelLost(r.promise)
                if relaxed {
                    checker.check(record.runs <= expected.runs, "\(what): ran \(record.runs) times, expected \(expected)")
                } else {
                    checker.check(record.runs == expected.runs, "\(what): ran \(record.runs) times, expected \(expected)")
                }
                if record.runs > 0 {
                    checker.check(record.seen == expected.seen,
                                  "\(what): handler saw \(record.seen.map(String.init(describing:)) ?? "-"), expected \(expected)")
                }
                if let child = r.child {
                    let settled = Settled(child)
                    if relaxed, case .cancelled(let tag) = settled, cancelTags[r.promise].contains(tag) {
                        relaxedChildren += 1
                    } else {
                        checker.check(settled == expected.child, "\(what): child ended \(settled), expected \(expected)")
                    }
                }
                if record.runs > 0 {
                    if r.context == .immediate || r.form == .onCancel {
                        checker.check(record.seat == winnerSeat[r.promise] || record.seat == r.seat,
                                      "\(what): .immediate handler ran on seat \(record.seat.map(String.init) ?? "none"), "
                                          + "neither the settler (\(winnerSeat[r.promise])) nor the registrar")
                        if record.seat == r.seat { inline += 1 } else { bySettler += 1 }
                    } else {
                        checker.check(record.seat == nil,
                                      "\(what): handler ran on racing seat \(record.seat ?? -1), not on its context")
                        if r.context == .main {
                            checker.check(record.onMainThread, "\(what): .main handler ran off the main thread")
                        }
                    }
                }
                r.probe.seal(maxRuns: relaxed ? max(record.runs, expected.runs) : expected.runs,
                             expected: expected.seen, label: what)
            }
            immediateBySettler += bySettler
            immediateInline += inline
            if bySettler > 0 && inline > 0 { roundsWithBoth += 1 }

            let waited = waitBox.items.first
            let expectedWait = outcomeTable(.whenComplete, after: outcome[round % promisesPerRound]).seen
            checker.check(waited == expectedWait,
                          "wait() returned \(waited.map(String.init(describing:)) ?? "nothing"), expected \(expectedWait.map(String.init(describing:)) ?? "-")")
            checker.check(log.count == 0, "late handler runs: \(log.first)")
            return true
        }
        drainContexts()
        XCTAssertEqual(log.count, 0, "handlers that ran after their round was checked: \(log.first)")
    }
}
