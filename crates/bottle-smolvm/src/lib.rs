//! `bottle-smolvm` is the smolmachines backend: the `smolvm` wrapper, the
//! state-DB allowlist patcher and the Smolfile renderer.
