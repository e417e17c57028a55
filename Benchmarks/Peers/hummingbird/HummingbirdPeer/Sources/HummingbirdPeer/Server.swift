import Foundation
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOPosix

/// Request context: the WebSocket handler reference HummingbirdWebSocket needs, plus the authenticated account.
struct PeerRequestContext: RequestContext, WebSocketRequestContext {
    var coreContext: CoreRequestContextStorage
    let webSocket: WebSocketHandlerReference<Self>
    var account: String?

    init(source: Source) {
        self.coreContext = .init(source: source)
        self.webSocket = .init()
        self.account = nil
    }
}

/// Verifies `?access_token=` (or `Authorization: Bearer`) before the upgrade; 401 otherwise.
struct JWTAuthMiddleware: RouterMiddleware {
    typealias Context = PeerRequestContext
    let verifier: HS256Verifier

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var token: Substring?
        if let header = request.headers[.authorization], header.hasPrefix("Bearer ") {
            token = header.dropFirst("Bearer ".count)
        } else if let query = request.uri.queryParameters.get("access_token") {
            token = Substring(query)
        }
        guard let token, let account = verifier.account(fromToken: token) else {
            return Response(status: .unauthorized)
        }
        var context = context
        context.account = account
        return try await next(request, context)
    }
}

enum JSONText {
    /// A Swift string as a JSON string literal.
    static func quote(_ s: String) -> String { RawJSON.quote(s) }

    /// Any JSON value (as decoded by JSONSerialization) back to text.
    static func encode(_ value: Any) -> String? {
        guard let data = try? JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed, .withoutEscapingSlashes])
        else { return nil }
        return String(decoding: data, as: UTF8.self)
    }

    static func error(_ code: String, _ message: String) -> String {
        "{\"ok\":false,\"error\":{\"code\":\(quote(code)),\"message\":\(quote(message))}}"
    }
}

/// The client side of `/ws`: subscribe, unsubscribe, ping. Replies and events share the connection's outbox.
func runConnection(
    account: String,
    inbound: WebSocketInboundStream,
    outbound: WebSocketOutboundWriter,
    registry: Registry
) async {
    let id = registry.newConnectionID()
    let (outboxStream, outbox) = AsyncStream<ByteBuffer>.makeStream(bufferingPolicy: .unbounded)
    var channels = Set<String>()
    await withTaskGroup(of: Void.self) { group in
        group.addTask {
            do {
                for await buffer in outboxStream {
                    try await outbound.write(.custom(.init(fin: true, opcode: .text, data: buffer)))
                }
            } catch {}
        }
        do {
            for try await message in inbound.messages(maxSize: 64 * 1024) {
                guard case .text(let text) = message else { continue }
                guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                    let type = object["type"] as? String
                else {
                    outbox.yield(ByteBuffer(string: clientError(nil, "VALIDATION_ERROR", "expected a JSON object with a type")))
                    continue
                }
                let idSuffix = object["id"].flatMap { JSONText.encode($0) }.map { ",\"id\":\($0)" } ?? ""
                switch type {
                case "subscribe", "unsubscribe":
                    guard let names = object["channels"] as? [String] else {
                        outbox.yield(ByteBuffer(string: clientError(idSuffix, "VALIDATION_ERROR", "channels must be an array of strings")))
                        continue
                    }
                    let list = JSONText.encode(names) ?? "[]"
                    if type == "subscribe" {
                        channels.formUnion(names)
                        let reply = ByteBuffer(string: "{\"type\":\"subscribed\",\"channels\":\(list)\(idSuffix)}")
                        registry.subscribe(id: id, account: account, channels: names, outbox: outbox, reply: reply)
                    } else {
                        channels.subtract(names)
                        registry.unsubscribe(id: id, account: account, channels: names)
                        outbox.yield(ByteBuffer(string: "{\"type\":\"unsubscribed\",\"channels\":\(list)\(idSuffix)}"))
                    }
                case "ping":
                    outbox.yield(ByteBuffer(string: "{\"type\":\"pong\"\(idSuffix)}"))
                default:
                    outbox.yield(ByteBuffer(string: clientError(idSuffix, "VALIDATION_ERROR", "unknown type")))
                }
            }
        } catch {}
        registry.unsubscribe(id: id, account: account, channels: channels)
        outbox.finish()
        group.cancelAll()
    }
}

private func clientError(_ idSuffix: String?, _ code: String, _ message: String) -> String {
    "{\"type\":\"error\"\(idSuffix ?? ""),\"error\":{\"code\":\(JSONText.quote(code)),\"message\":\(JSONText.quote(message))}}"
}

/// One publish request (one JSON object) → one reply line (without the newline).
func publish(line: some Sequence<UInt8>, registry: Registry) -> (reply: String, ok: Bool) {
    let line = Data(line)
    guard let object = try? JSONSerialization.jsonObject(with: line) as? [String: Any] else {
        return (JSONText.error("INVALID_JSON", "not a JSON object"), false)
    }
    guard let channel = object["channel"] as? String, !channel.isEmpty else {
        return (JSONText.error("INVALID_REQUEST", "channel must be a non-empty string"), false)
    }
    guard let type = object["type"] as? String, !type.isEmpty, type.utf8.count <= 128 else {
        return (JSONText.error("INVALID_REQUEST", "type must be a non-empty string of at most 128 bytes"), false)
    }
    let account = object["account"] as? String
    let broadcast = (object["broadcast"] as? Bool) ?? false
    if account != nil && broadcast || account == nil && !broadcast || account?.isEmpty == true {
        return (JSONText.error("INVALID_REQUEST", "exactly one of account or \"broadcast\":true is required"), false)
    }
    // `data` byte for byte from the (validated) line, like the hub; `null` when absent.
    let data: String
    if object["data"] == nil {
        data = "null"
    } else if let range = line.withUnsafeBytes({ RawJSON.rawMember("data", in: $0) }) {
        data = String(decoding: line[range], as: UTF8.self)
    } else if let encoded = JSONText.encode(object["data"]!) {
        data = encoded
    } else {
        return (JSONText.error("INVALID_REQUEST", "data is not encodable"), false)
    }
    let head = "{\"type\":\(JSONText.quote(type)),\"channel\":\(JSONText.quote(channel)),\"seq\":"
    let tail = broadcast ? ",\"broadcast\":true,\"data\":\(data)}" : ",\"data\":\(data)}"
    let (seq, delivered) = registry.publish(channel: channel, account: account, head: head, tail: tail)
    return ("{\"ok\":true,\"seq\":\(seq),\"delivered\":\(delivered)}", true)
}

func buildApplication(host: String, port: Int, threads: Int, secret: String, logger: Logger) -> some ApplicationProtocol {
    let registry = Registry()
    let verifier = HS256Verifier(secret: secret)

    // HTTP: POST /publish, a single JSON object or NDJSON (one object per line → one reply per line, in order).
    let router = Router(context: PeerRequestContext.self)
    router.post("/publish") { request, _ -> Response in
        let body = try await request.body.collect(upTo: 64 * 1024 * 1024)
        let bytes = body.readableBytesView
        let lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true)
            .filter { !$0.allSatisfy { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\t") } }
        var out = ByteBuffer()
        // NDJSON when there are several lines and the first is a whole object on its own; otherwise the body is
        // one (possibly pretty-printed) object.
        let isBatch = lines.count > 1 && lines[0].last(where: { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\r") && $0 != UInt8(ascii: "\t") }) == UInt8(ascii: "}")
        if isBatch {
            for line in lines {
                out.writeString(publish(line: line, registry: registry).reply)
                out.writeString("\n")
            }
            return Response(status: .ok, headers: [.contentType: "application/x-ndjson"], body: .init(byteBuffer: out))
        }
        let result = publish(line: bytes, registry: registry)
        out.writeString(result.reply)
        out.writeString("\n")
        return Response(
            status: result.ok ? .ok : .badRequest,
            headers: [.contentType: "application/json"],
            body: .init(byteBuffer: out)
        )
    }
    router.get("/healthz") { _, _ in "ok\n" }

    // WebSocket: GET /ws?access_token=JWT
    let wsRouter = Router(context: PeerRequestContext.self)
    wsRouter.add(middleware: JWTAuthMiddleware(verifier: verifier))
    wsRouter.ws("/ws") { _, context in
        context.account == nil ? .dontUpgrade : .upgrade([:])
    } onUpgrade: { inbound, outbound, context in
        guard let account = context.requestContext.account else { return }
        await runConnection(account: account, inbound: inbound, outbound: outbound, registry: registry)
    }

    return Application(
        router: router,
        server: .http1WebSocketUpgrade(
            webSocketRouter: wsRouter,
            configuration: .init(
                // Like the hub's /ws: 64 KiB messages, a ping every 25 s, UTF-8 checked, no permessage-deflate.
                ws: .init(maxFrameSize: 64 * 1024, autoPing: .enabled(timePeriod: .seconds(25)), validateUTF8: true)
            )
        ),
        configuration: .init(address: .hostname(host, port: port), serverName: "HummingbirdPeer"),
        onServerRunning: { channel in
            let address = channel.localAddress.map { "\($0)" } ?? "?"
            FileHandle.standardOutput.write(Data("HummingbirdPeer listening on \(address) threads=\(threads)\n".utf8))
        },
        eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup(numberOfThreads: threads)),
        logger: logger
    )
}
