/// The version `hub --version` and `hubctl --version` print.
public enum HubVersion {
    public static let string = "0.1.0"
}
