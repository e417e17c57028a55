import Glibc
import HubAuth
import WSProtocol

/// The HTTP side of a client port: what the hub answers a complete request head, before any WebSocket exists.
/// `decide` only reads the head and the hub's state; `ClientConnection` carries the decision out (writes, gauges,
/// the account count, timers), so every HTTP rule is here and the session's code starts at the upgrade.
struct FrontDoor {
    let hub: HubCore
    let allowedOrigins: OriginPolicy

    enum Decision {
        /// A complete response, then the connection closes; `headOnly` for a HEAD request (the head alone).
        case respond([UInt8], headOnly: Bool)
        /// `/healthz`, `/metrics`: gathered from every loop, answered when they have reported.
        case health(headOnly: Bool)
        case metrics(headOnly: Bool)
        /// A token that did not verify: 401, logged and counted by the caller.
        case refused(AuthFailure)
        /// `/ws`: the hub's protocol, as the account the token proved, or none yet (first-message auth).
        case session(UpgradeRequest, subprotocol: String?, identity: Identity)
        /// `/echo` (with `--echo`).
        case echo(UpgradeRequest)
    }

    enum Identity {
        /// No token in the request: the first message must be `auth`.
        case awaitingAuth
        case verified(VerifiedToken, platform: String?, appVersion: String?)
    }

    /// The subprotocol name of the hub's JSON protocol, answered when a client offers it (RFC 6455 §4.2.2).
    static let subprotocol = "hub.v1"

    /// `answersBusy`: a TLS client over the connection limit, told 503 whatever it asks (inside TLS, where it can
    /// read it).
    func decide(_ head: HTTPRequestHead, answersBusy: Bool) -> Decision {
        if answersBusy { return .respond(ClientAcceptor.busyResponse, headOnly: false) }
        do {
            try head.validateHost()
        } catch {
            return .respond(error.response(), headOnly: false)
        }
        let readOnly = head.method == "GET" || head.method == "HEAD"
        let headOnly = head.method == "HEAD"
        switch head.path {
        case "/ws":
            return upgrade(head, echo: false)
        case "/echo" where hub.configuration.echo:
            return upgrade(head, echo: true)
        case "/healthz":
            return readOnly ? .health(headOnly: headOnly) : .respond(Self.methodNotAllowed, headOnly: false)
        case "/readyz":
            // Readiness, not liveness: 503 from the moment shutdown begins, so a load balancer stops sending new
            // clients while the connected ones are drained (`/healthz` stays 200: the process is alive).
            guard readOnly else { return .respond(Self.methodNotAllowed, headOnly: false) }
            return .respond(hub.isShuttingDown ? Self.drainingResponse : Self.readyResponse, headOnly: headOnly)
        case "/metrics":
            return readOnly ? .metrics(headOnly: headOnly) : .respond(Self.methodNotAllowed, headOnly: false)
        default:
            return .respond(HTTPError(status: 404, code: "NOT_FOUND", message: "no such path: \(head.path)").response(), headOnly: false)
        }
    }

    private func upgrade(_ head: HTTPRequestHead, echo: Bool) -> Decision {
        let request: UpgradeRequest
        do {
            request = try WebSocketHandshake.validateUpgrade(head)
        } catch {
            return .respond(error.response(), headOnly: false)
        }
        if hub.isShuttingDown {
            return .respond(HTTPError(status: 503, code: "SERVICE_UNAVAILABLE", message: "the hub is shutting down",
                                      headers: [("Retry-After", "5")]).response(), headOnly: false)
        }
        let origins = head.headers.values("Origin")
        guard origins.count <= 1, allowedOrigins.allows(origins.first) else {
            let origin = origins.first.map { "\"\(Self.clip($0))\"" } ?? ""
            return .respond(HTTPError(status: 403, code: "FORBIDDEN", message: "origin \(origin) is not allowed (--allowed-origins)").response(),
                            headOnly: false)
        }
        if echo { return .echo(request) }
        let authorizations = head.headers.count(of: "Authorization")
        guard authorizations <= 1 else {
            // RFC 9110 makes Authorization a singleton field: which one would be meant is ambiguous.
            return .respond(HTTPError.badRequest("more than one Authorization header").response(), headOnly: false)
        }
        // Our protocol's name when offered; anything else is declined by leaving the header out (RFC 6455 §4.2.2):
        // the client then decides, the handshake does not fail here.
        let subprotocol = request.subprotocols.contains(Self.subprotocol) ? Self.subprotocol : nil
        // The token is read where it lies in the request head: no `String` of it is made.
        let unixNow = Int64(time(nil))
        let header = authorizations == 0 ? nil : head.headers.firstValueBytes("Authorization")
        let verified = head.withQueryValue("access_token") { query -> Result<VerifiedToken, AuthFailure>? in
            // No token at all: first-message auth (a browser cannot set headers, and a token in the URL ends up in
            // logs). The session opens; the first message must be a valid `auth`.
            if header == nil && query == nil { return nil }
            return TokenExtraction.withBearerToken(authorizationHeader: header, accessTokenQuery: query) {
                hub.verifier.verify(bytes: $0, now: unixNow)
            }
        }
        switch verified {
        case nil:
            return .session(request, subprotocol: subprotocol, identity: .awaitingAuth)
        case .success(let token)?:
            return .session(request, subprotocol: subprotocol, identity: .verified(
                token, platform: head.headers[first: "X-Platform"].map { Self.clip($0) },
                appVersion: head.headers[first: "X-App-Version"].map { Self.clip($0) }))
        case .failure(let failure)?:
            return .refused(failure)
        }
    }

    // MARK: Responses

    /// The response up to and including the blank line that ends its head.
    static func head(of response: [UInt8]) -> ArraySlice<UInt8> {
        var i = 3
        while i < response.count {
            if response[i] == 0x0A && response[i - 1] == 0x0D && response[i - 2] == 0x0A && response[i - 3] == 0x0D {
                return response[...i]
            }
            i += 1
        }
        return response[...]
    }

    static let readyResponse = HTTPResponse.json(status: 200, body: #"{"status":"ready"}"#)
    static let drainingResponse = HTTPError(status: 503, code: "SHUTTING_DOWN", message: "the hub is shutting down; connect to another",
                                            headers: [("Retry-After", "5")]).response()
    /// A TLS ClientHello at a plain port, answered in the clear.
    static let tlsToPlainResponse = HTTPError(status: 400, code: "TLS_NOT_ENABLED",
                                              message: "this port speaks plain HTTP: connect with ws:// (or http://)").response()
    static let methodNotAllowed = HTTPError(status: 405, code: "METHOD_NOT_ALLOWED", message: "only GET is allowed here",
                                            headers: [("Allow", "GET")]).response()

    /// A header value kept for admin views, at most 64 bytes of whole characters.
    static func clip(_ value: String) -> String {
        guard value.utf8.count > 64 else { return value }
        // Whole characters only: cutting inside one would store U+FFFD and exceed 64 bytes.
        var bytes = 0
        let kept = value.unicodeScalars.prefix { scalar in
            bytes += UTF8.width(scalar)
            return bytes <= 64
        }
        return String(String.UnicodeScalarView(kept))
    }
}
