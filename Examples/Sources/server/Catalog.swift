// What both order services share, so that their replies can differ only if their engines
// do: the made-up catalogue, the routing of a request target, and every reply's text.
import NIOHTTP1

/// The made-up catalogue the lookups read. Deterministic, so that the load test can
/// check every response body (Examples/LoadTest/orders.lua recomputes these).
///
/// Every id from 0 to `Int.max` is an order, so the arithmetic reduces the id first and
/// cannot overflow: `id * 7 % 100 + 1` and `(id + shard) % 4` as written, and equal to
/// them wherever those fit in an `Int`. (`id + shard` trapped for the largest ids, which
/// took the whole server down, and a wrapping `id &* 7` made some prices negative.)
/// Prices are 1...100 and stocks 0...9, so a reply's total cannot overflow either.
enum Catalog {
    static let stockShards = 3

    static func userName(_ id: Int) -> String { "user-\(id)" }
    static func price(_ id: Int) -> Int { id % 100 * 7 % 100 + 1 }
    static func stock(_ id: Int, shard: Int) -> Int { (id % 4 + shard) % 4 }
}

/// What the channel handler writes back.
struct Reply: Sendable, Equatable {
    let status: HTTPResponseStatus
    let body: String

    static let health = Reply(status: .ok, body: "ok\n")
    static let badOrderID = Reply(status: .badRequest, body: "bad order id\n")
    static let timedOut = Reply(status: .gatewayTimeout, body: "timed out\n")

    static func notFound(_ uri: String) -> Reply {
        Reply(status: .notFound, body: "not found: \(uri)\n")
    }

    static func failed(_ error: any Error) -> Reply {
        Reply(status: .internalServerError, body: "failed: \(error)\n")
    }

    static func order(_ id: Int, user: String, price: Int, stock: Int) -> Reply {
        Reply(status: .ok, body: "id=\(id) user=\(user) price=\(price) stock=\(stock) total=\(price * stock)\n")
    }
}

/// A request target, routed once for both services: an order to look up, or a reply
/// that needs no lookup (/health, an unknown path, a bad id).
enum Route: Equatable {
    case order(Int)
    case reply(Reply)

    init(_ uri: String) {
        let prefix = "/order/"
        if uri == "/health" {
            self = .reply(.health)
        } else if !uri.hasPrefix(prefix) {
            self = .reply(.notFound(uri))
        } else if let id = Int(uri.dropFirst(prefix.count)), id >= 0 {
            self = .order(id)
        } else {
            self = .reply(.badOrderID)
        }
    }
}
