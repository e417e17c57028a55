import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine

@Suite("Redis node registry against a real redis-server", .serialized)
struct RedisNodesTests {
    @Test("nodes that beat are listed with their info; one that stops goes stale and is dropped; one that leaves is gone at once",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func heartbeats() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let registry = RedisNodes(staleMillis: 400)
        func beat(_ id: String, _ info: String) throws -> Int64 {
            try r.onLoop { redis, done in registry.heartbeat(id: id, info: info, on: redis) { done($0) } }.get()
        }
        func list() throws -> [RedisNodes.Node] {
            try r.onLoop { redis, done in registry.nodes(on: redis) { done($0) } }.get()
        }
        let t0 = try beat("node-b", #"{"port":8081}"#)
        _ = try beat("node-a", #"{"port":8080}"#)
        _ = try beat("node-c", "")
        let three = try list()
        #expect(three.map(\.id) == ["node-a", "node-b", "node-c"])
        #expect(three.map(\.info) == [#"{"port":8080}"#, #"{"port":8081}"#, ""])
        #expect(three.allSatisfy { $0.ageMillis >= 0 && $0.ageMillis < 400 }, "\(three)")

        // node-a and node-b keep beating; node-c stops.
        var last = t0
        for _ in 0..<8 {
            usleep(100_000)
            _ = try beat("node-a", #"{"port":8080}"#)
            last = try beat("node-b", #"{"port":8081,"connections":2}"#)
        }
        #expect(last - t0 >= 700, "Redis's clock moved on")
        #expect(try list().map(\.id) == ["node-a", "node-b"])
        #expect(try list().first { $0.id == "node-b" }?.info == #"{"port":8081,"connections":2}"#)
        #expect(try r.call(["HEXISTS", registry.infoKey, "node-c"]).get() == .integer(0), "a stale node's info is dropped too")

        _ = try r.onLoop { redis, done in registry.leave(id: "node-a", on: redis) { done($0.map { 1 }) } }.get()
        #expect(try list().map(\.id) == ["node-b"])
    }
}
