"""The development harness: real and wire-level stores on loopback, pod tokens, certificates,
builders of the provider's inputs, the bench rigs and the demo.

Outside the wheel (tests, `make demo` and `secrets-bridge bench` from a source checkout use it);
it needs the test extras (`bao`, `moto_server`, hvac, PyJWT). Modules, by concern:

    ports      free loopback ports, and serving an aiohttp app on one
    tokens     the cluster's service-account token signer (pod tokens)
    certs      one builder of CAs, leaves and chains (TLS servers, Key Vault objects)
    openbao    a real OpenBao dev server (TLS, audit counts) and its admin steps
    moto       a real moto_server, and the counting/fault-injecting proxy before it
    proxy      a fault proxy for any HTTP store (429/5xx share, delay)
    hangs      a proxy that accepts and never answers (store outages)
    connect_proxy   a forward proxy (CONNECT tunnels, plain-HTTP forwarding) that counts calls
    kube       Kubernetes API stand-ins: TokenReview, TokenRequest, ServiceAccount reads
    eks        the EKS Pod Identity agent
    fakevault  a scriptable Vault wire for faults a real server cannot produce on demand
    google     Secret Manager (gRPC), STS, IAM and OAuth on the wire
    google_params   Parameter Manager (gRPC) on the wire
    azure      Microsoft Entra and Key Vault on the wire
    testing    builders: BackendEnv, Pod, FetchContext, MountRequest, the fake-store Harness
    kubeapi    the Kubernetes API server on the wire: list+watch, Leases, ConfigMaps, faults
    pubsub     Pub/Sub's Subscriber and Publisher (gRPC) on the wire
    azurite    Azurite, the Azure Storage emulator (queues), installed from deploy/azurite/
    feeds      a recording change Feed, as the change sources' tests hand it to them
    feedrig    the change feed end to end: OpenBao's audit stream, the watchers, the API fake, serve
    serving    the provider serving on a Unix socket, and a driver-like client
    leaks      what counts as secret material in logs and metrics
    rigs, demo the bench's stores, `make demo`
    forward    a TCP forwarder the bench's soak restarts a store behind
    probes     one-off experiments behind BENCHMARKS.md (memory and cost probes, the scale
               model, the outage soak, bench_all.sh); tests do not import them
"""
