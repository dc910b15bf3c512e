//! The compilation cache's entry reader: any bytes are accepted only when they are a
//! well-formed entry for the key, and never make it panic; entries it writes read back.

#![no_main]

use libfuzzer_sys::fuzz_target;

// The cache module is plain std + sha2: compiled here on its own, so the fuzzer does
// not build the runtime's LLVM and PJRT dependencies.
#[allow(dead_code)]
#[path = "../../../runtime/src/cache.rs"]
mod cache;
// What the cache reads its settings through (plain std).
#[allow(dead_code)]
#[path = "../../../runtime/src/config.rs"]
mod config;

fuzz_target!(|data: &[u8]| {
    let key = [7u8; 32];
    if let Ok(payload) = cache::decode_entry(data, &key) {
        // Accepted bytes are exactly the encoding of their payload.
        assert_eq!(cache::encode_entry(&key, payload), data);
    }
    let encoded = cache::encode_entry(&key, data);
    assert_eq!(cache::decode_entry(&encoded, &key), Ok(data));
    assert!(cache::decode_entry(&encoded, &[8u8; 32]).is_err());
});
