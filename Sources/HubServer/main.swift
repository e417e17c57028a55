import Hub

print("hub \(HubVersion.string): server not built yet")
