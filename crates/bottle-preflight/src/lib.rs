//! `bottle-preflight` owns host checks (platform, KVM, smolvm, Docker,
//! kernel). It only observes; it never changes the host.
