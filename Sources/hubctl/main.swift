import Hub

print("hubctl \(HubVersion.string): not built yet")
