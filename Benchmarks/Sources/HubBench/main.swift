import Foundation
import Glibc

// hubbench: the load generator of the benchmark suite (see Benchmarks/README.md).
signal(SIGPIPE, SIG_IGN)
let arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else {
    print("""
    usage: hubbench SCENARIO [options]        scenarios: connections broadcast per-account churn slow publish
                                              reconnect-storm (hub only)
           hubbench report --results DIR --out FILE
      --server NAME --kind hub|jwt|nchan --port N --publish unix:PATH|http://H:P/publish|nchan://H:P
      --server-pid PID (RSS/CPU from /proc) --admin-socket PATH (hub) --out FILE.json
      --n N --rate R (connections/s) --workers K --duration S --interval-ms MS --steps A,B,C --step-seconds S
    The servers' HS256 secret comes from HUBBENCH_SECRET.
    """)
    exit(2)
}
let options = Options(Array(arguments.dropFirst()))
switch command {
case "worker":
    WorkerMain.run(arguments.count > 1 ? arguments[1] : "")
case "report":
    Report.run(options)
case "connections", "broadcast", "per-account", "churn", "slow", "publish", "reconnect-storm":
    let c = Coordinator(scenario: command, options: options)
    switch command {
    case "connections": c.runConnections()
    case "broadcast": c.runBroadcast()
    case "per-account": c.runPerAccount()
    case "churn": c.runChurn()
    case "slow": c.runSlow()
    case "reconnect-storm": c.runReconnectStorm()
    default: c.runPublish()
    }
    c.finish()
    exit(0)
default:
    fail("unknown command \(command)")
}
