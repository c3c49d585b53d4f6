//! How a disk size is shown to the operator, and rounded where only
//! whole GiB can be expressed. Whether a backend's storage can enforce
//! `limits.disk` is that backend's to judge (the docker backend's
//! `storage` module).

/// A size for people: whole GiB or MiB when it is one, bytes otherwise.
pub fn format_size(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// `bytes` in whole GiB, rounded up: for sizes only whole GiB can express
/// (smolvm's `--storage`), the cap is never below what was asked.
pub fn whole_gib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        assert_eq!(format_size(10 << 30), "10 GiB");
        assert_eq!(format_size(3 << 29), "1536 MiB");
        assert_eq!(format_size(1000), "1000 bytes");
        assert_eq!(whole_gib_ceil(1 << 30), 1);
        assert_eq!(whole_gib_ceil((1 << 30) + 1), 2);
        assert_eq!(whole_gib_ceil(256 << 20), 1);
    }
}
