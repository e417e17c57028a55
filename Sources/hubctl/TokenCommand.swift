import Foundation
import Hub
import HubAuth

enum TokenCommand {
    static let spec = CommandSpec("token", valueFlags: ["ttl", "secret-file", "state-dir"], positionals: ["ACCOUNT"])
    static let help = """
        usage: hubctl token ACCOUNT [--ttl 15m] [--secret-file F] [--state-dir D] [--json]

        Mint an HS256 test token for ACCOUNT (claims sub, iat, exp) with the hub's secret, and print only the
        token. TTL: 90s, 15m, 2h, 1d or plain seconds (default 15m, at most 366d). The secret is read from --secret-file,
        else $HUB_JWT_SECRET_FILE, else STATE_DIR/jwt-secret, where STATE_DIR is --state-dir, else
        $HUB_STATE_DIR, else ./.hub-state (the hub creates the secret there on its first start). Surrounding
        whitespace in the file is ignored; like the hub, hubctl refuses secrets under 32 bytes (RFC 7518).
        Does not contact the hub.
        With --json: {"token":"...","account":"acc_1","expiresAt":1700000900}.

        examples:
          TOKEN=$(hubctl token acc_1)
          hubctl token acc_1 --ttl 2h --secret-file /etc/hub/jwt-secret
        """

    static func run(_ context: Context) throws(CLIError) {
        let account = context.args.positionals[0]
        guard !account.isEmpty else { throw context.usage("ACCOUNT must not be empty") }
        let ttlText = context.value("ttl") ?? "15m"
        guard let ttl = JWTClaims.parseTTL(ttlText) else {
            throw context.usage("--ttl \"\(ttlText)\" is not a duration: use 90s, 15m, 2h, 1d or seconds")
        }
        let env = context.environment
        let path: String
        if let file = context.value("secret-file") {
            path = file
        } else if let file = env["HUB_JWT_SECRET_FILE"], !file.isEmpty {
            path = file
        } else {
            let stateDir = context.value("state-dir") ?? env["HUB_STATE_DIR"].flatMap { $0.isEmpty ? nil : $0 }
                ?? "./.hub-state"
            path = (stateDir.hasSuffix("/") ? stateDir : stateDir + "/") + "jwt-secret"
        }
        guard FileManager.default.fileExists(atPath: path) else {
            throw .input("no secret file at \(path): start the hub once to create it, or pass --secret-file")
        }
        let secret: [UInt8]
        do {
            secret = try SecretFile.read(path: path).secret
        } catch {
            throw .input("cannot use the secret file: \(error)")
        }
        let issuedAt = Int64(now())
        let token: String
        do {
            token = try JWTSigner(key: .hmacSecret(secret)).sign(JWTClaims(sub: account, exp: issuedAt + ttl, iat: issuedAt))
        } catch {
            throw .input("cannot sign with the secret in \(path): \(error)")
        }
        if context.json {
            print(#"{"token":"\#(token)","account":\#(AdminClient.jsonString(account)),"expiresAt":\#(issuedAt + ttl)}"#)
        } else {
            print(token)
        }
    }
}
