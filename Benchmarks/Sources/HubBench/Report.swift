import Foundation

enum Report {
    static func run(_ options: Options) -> Never {
        fail("report: not yet")
    }
}
