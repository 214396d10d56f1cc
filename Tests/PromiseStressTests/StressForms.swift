// Every way of observing a promise, each with a handler that records what it saw into a
// probe and a result that says which handler produced it, and the table of what each
// form must do for each outcome of the promise it observes.
import Foundation
import Promise

/// The observing forms of the public API (children of every kind, plus the observers
/// that create no child).
enum Form: Int, CaseIterable, Sendable, CustomStringConvertible {
    case thenMap, thenFlat, thenBoth, map, flatMap, recover, recoverFlat, mapError
    case catchError, always, validate, whenComplete, onCancel

    var description: String {
        switch self {
        case .thenMap: return "then(map)"
        case .thenFlat: return "then(flatMap)"
        case .thenBoth: return "then(onFulfilled, onRejected)"
        case .map: return "map"
        case .flatMap: return "flatMap"
        case .recover: return "recover"
        case .recoverFlat: return "recover(-> Promise)"
        case .mapError: return "mapError"
        case .catchError: return "catch"
        case .always: return "always"
        case .validate: return "validate"
        case .whenComplete: return "whenComplete"
        case .onCancel: return "onCancel"
        }
    }

    /// Whether the form creates a child promise.
    var hasChild: Bool { self != .whenComplete && self != .onCancel }

    /// Whether a cancelled parent runs the handler (the error side, for clean-up).
    var hasErrorSide: Bool {
        switch self {
        case .thenBoth, .recover, .recoverFlat, .mapError, .catchError, .always: return true
        default: return false
        }
    }
}

/// A promise the flat forms return: already settled, or settled later on `context`.
func followee(_ value: Int, on context: any ExecutionContext = .default) -> Promise<Int> {
    value & 1 == 0 ? Promise(value: value) : Promise<Int>(on: context) { value }
}

/// Registers `form` on `promise`, its handler recording into `probe`; returns the child.
func register(_ form: Form, on promise: Promise<Int>, context kind: ContextKind,
              probe: Probe) -> Promise<Int>? {
    register(form, on: promise, in: kind.context, probe: probe)
}

/// `register` with any context; the promises the flat forms return settle on `followOn`.
func register(_ form: Form, on promise: Promise<Int>, in context: any ExecutionContext,
              followOn: any ExecutionContext = .default, probe: Probe) -> Promise<Int>? {
    switch form {
    case .thenMap:
        return promise.then(on: context) { (v: Int) -> Int in
            probe.hit(.value(v))
            return v + 1
        }
    case .thenFlat:
        return promise.then(on: context) { (v: Int) -> Promise<Int> in
            probe.hit(.value(v))
            return followee(v + 2, on: followOn)
        }
    case .thenBoth:
        return promise.then(on: context, { (v: Int) -> Int in
            probe.hit(.value(v))
            return v + 3
        }, { (e: any Error) -> Int in
            probe.hit(.error(ErrorTag(e)))
            return 10_000 + e.stressID
        })
    case .map:
        return promise.map(on: context) { (v: Int) -> Int in
            probe.hit(.value(v))
            return v + 1
        }
    case .flatMap:
        return promise.flatMap(on: context) { (v: Int) -> Promise<Int> in
            probe.hit(.value(v))
            return followee(v + 2, on: followOn)
        }
    case .recover:
        return promise.recover(on: context) { (e: any Error) -> Int in
            probe.hit(.error(ErrorTag(e)))
            return 20_000 + e.stressID
        }
    case .recoverFlat:
        return promise.recover(on: context) { (e: any Error) -> Promise<Int> in
            probe.hit(.error(ErrorTag(e)))
            return followee(30_000 + e.stressID, on: followOn)
        }
    case .mapError:
        return promise.mapError(on: context) { (e: any Error) -> any Error in
            probe.hit(.error(ErrorTag(e)))
            return StressError(id: e.stressID + 500)
        }
    case .catchError:
        return promise.catch(on: context) { (e: any Error) in
            probe.hit(.error(ErrorTag(e)))
        }
    case .always:
        return promise.always(on: context) {
            probe.hit(.nothing)
        }
    case .validate:
        return promise.validate(on: context) { (v: Int) -> Bool in
            probe.hit(.value(v))
            return v % 2 == 0
        }
    case .whenComplete:
        promise.whenComplete(on: context) { result in
            probe.hit(Seen(result))
        }
        return nil
    case .onCancel:
        promise.onCancel {
            probe.hit(.nothing)
        }
        return nil
    }
}

/// What a form must do once the promise it observes settled with `outcome`.
struct Expectation: Equatable, CustomStringConvertible {
    /// How often the handler runs (0 or 1).
    var runs: Int
    /// What it is handed when it runs.
    var seen: Seen?
    /// How its child ends (nil: the form has none).
    var child: Settled?

    var description: String {
        "runs \(runs)\(seen.map { " with \($0)" } ?? ""), child \(child?.description ?? "none")"
    }
}

func outcomeTable(_ form: Form, after outcome: Settled) -> Expectation {
    switch outcome {
    case .pending:
        preconditionFailure("an expectation needs a settled outcome")
    case .fulfilled(let v):
        switch form {
        case .thenMap, .map: return Expectation(runs: 1, seen: .value(v), child: .fulfilled(v + 1))
        case .thenFlat, .flatMap: return Expectation(runs: 1, seen: .value(v), child: .fulfilled(v + 2))
        case .thenBoth: return Expectation(runs: 1, seen: .value(v), child: .fulfilled(v + 3))
        case .recover, .recoverFlat, .mapError, .catchError:
            return Expectation(runs: 0, seen: nil, child: .fulfilled(v))
        case .always: return Expectation(runs: 1, seen: .nothing, child: .fulfilled(v))
        case .validate:
            return Expectation(runs: 1, seen: .value(v), child: v % 2 == 0 ? .fulfilled(v) : .rejected(.validation))
        case .whenComplete: return Expectation(runs: 1, seen: .value(v), child: nil)
        case .onCancel: return Expectation(runs: 0, seen: nil, child: nil)
        }
    case .rejected(let tag):
        let id: Int
        if case .stress(let n) = tag { id = n } else { id = -1 }
        switch form {
        case .thenMap, .map, .thenFlat, .flatMap, .validate:
            return Expectation(runs: 0, seen: nil, child: .rejected(tag))
        case .thenBoth: return Expectation(runs: 1, seen: .error(tag), child: .fulfilled(10_000 + id))
        case .recover: return Expectation(runs: 1, seen: .error(tag), child: .fulfilled(20_000 + id))
        case .recoverFlat: return Expectation(runs: 1, seen: .error(tag), child: .fulfilled(30_000 + id))
        case .mapError: return Expectation(runs: 1, seen: .error(tag), child: .rejected(.stress(id + 500)))
        case .catchError: return Expectation(runs: 1, seen: .error(tag), child: .rejected(tag))
        case .always: return Expectation(runs: 1, seen: .nothing, child: .rejected(tag))
        case .whenComplete: return Expectation(runs: 1, seen: .error(tag), child: nil)
        case .onCancel: return Expectation(runs: 0, seen: nil, child: nil)
        }
    case .cancelled(let tag):
        switch form {
        case .thenMap, .map, .thenFlat, .flatMap, .validate:
            return Expectation(runs: 0, seen: nil, child: .cancelled(tag))
        case .thenBoth, .recover, .recoverFlat, .mapError, .catchError:
            // The error side runs for clean-up; the child stays cancelled.
            return Expectation(runs: 1, seen: .error(tag), child: .cancelled(tag))
        case .always: return Expectation(runs: 1, seen: .nothing, child: .cancelled(tag))
        case .whenComplete: return Expectation(runs: 1, seen: .error(tag), child: nil)
        case .onCancel: return Expectation(runs: 1, seen: .nothing, child: nil)
        }
    }
}
