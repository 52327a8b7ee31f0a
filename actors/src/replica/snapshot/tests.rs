use super::*;

fn contract(digest: &str) -> ModelContract {
    ModelContract {
        architecture: "llama".into(),
        dtype: xinf_engine::KvDtype::F32,
        num_layers: 2,
        num_heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab_size: 100,
        context_length: 512,
        rope_theta: 10000.0,
        weights_digest: digest.into(),
        tokenizer_digest: "t".into(),
    }
}

#[test]
fn keys_chain_the_whole_prefix_and_the_model() {
    let c = contract("w");
    let a: Vec<u32> = (0..200).collect();
    let mut b = a.clone();
    b[3] = 99;
    let ka = chain_keys(&c, &a, 3);
    let kb = chain_keys(&c, &b, 3);
    assert_eq!(ka.len(), 3);
    // A different first page changes every later key too.
    assert!(ka.iter().zip(&kb).all(|(x, y)| x != y));
    // Same ids, same keys; a partial page has no key.
    assert_eq!(chain_keys(&c, &a[..150], 9), ka[..2]);
    // Another model never shares keys.
    assert_ne!(chain_keys(&contract("other"), &a, 3), ka);
}

#[test]
fn lru_eviction_spares_leased_pages_and_refuses_what_cannot_fit() {
    let mut s = SnapshotStore::new(30);
    let page = [7u8; 10];
    let keys = [1, 2, 3, 4];
    let ins = s.insert(&keys, 0, &[&page, &page, &page]);
    assert_eq!(ins.added.len(), 3);
    assert_eq!(s.longest_prefix(&keys), 3);
    // Key 1 is leased: the next page evicts key 2, the least recently used unleased one.
    let leased = s.lease(&[1]).expect("held");
    assert_eq!(&*leased[0], &page);
    let ins = s.insert(&keys, 3, &[&page]);
    assert_eq!(ins.evicted, vec![1]);
    assert_eq!(s.longest_prefix(&keys), 1);
    assert_eq!(s.stats(), StoreStats { pages: 3, bytes: 30, evictions: 1 });
    // A page larger than the budget is never kept.
    assert!(s.insert(&[9], 0, &[&[0u8; 31]]).added.is_empty());
    // With everything leased nothing can be evicted.
    s.lease(&[3, 4]).expect("held");
    assert!(s.insert(&[8], 0, &[&page]).added.is_empty());
    s.unlease(&[1, 3, 4]);
    assert_eq!(s.insert(&[8], 0, &[&page]).evicted.len(), 1);
}

#[test]
fn a_chain_is_read_back_in_prefix_order() {
    let mut s = SnapshotStore::new(1000);
    let keys = [11, 12, 13];
    let pages: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 4]).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    s.insert(&keys, 0, &refs);
    let got = s.chain(13, 2).expect("held");
    assert_eq!(got.iter().map(|p| p[0]).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(s.chain(13, 3).expect("held").len(), 3);
    assert!(s.chain(13, 4).is_none());
    assert!(s.chain(99, 1).is_none());
    // Inserting again only touches.
    assert!(s.insert(&keys, 0, &refs).added.is_empty());
}

#[test]
fn a_chain_asked_for_by_a_peer_reserves_no_more_than_the_store_holds() {
    // `count` comes off the page plane's wire: u32::MAX pages must not reserve 32 GiB of keys.
    let mut s = SnapshotStore::new(100);
    let page = [1u8; 10];
    s.insert(&[5, 6], 0, &[&page, &page]);
    assert!(s.chain(6, u32::MAX as usize).is_none());
    assert_eq!(s.chain(6, 2).map(|c| c.len()), Some(2));
}
