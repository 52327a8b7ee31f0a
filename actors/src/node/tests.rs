//! Addresses, secrets and names.

use super::*;

#[test]
fn wildcard_hosts_are_refused() {
    for host in ["0.0.0.0", "::", "[::]"] {
        let e = listen_ip(host).expect_err("wildcard");
        assert_eq!(e.code(), "invalid_cluster_config");
        assert!(e.to_string().contains("no address other nodes can reach"), "{e}");
    }
    assert!(listen_ip("").is_err());
    assert_eq!(listen_ip("127.0.0.1"), Ok(IpAddr::from([127, 0, 0, 1])));
    assert_eq!(listen_ip("[::1]"), Ok("::1".parse().expect("ip")));
    assert_eq!(listen_ip("localhost").map(|ip| ip.is_loopback()), Ok(true));
}

#[test]
fn a_short_or_empty_secret_is_refused() {
    assert!(check_secret("").is_err());
    assert!(check_secret("s3cret").is_err(), "6 characters");
    assert!(check_secret("sécrets!").is_ok(), "8 characters, counted as characters");
    assert!(check_secret("s3cret-long-enough").is_ok());
}

#[test]
fn namespaces_follow_the_secret() {
    assert_eq!(Namespace::from_secret("a"), Namespace::from_secret("a"));
    assert_ne!(Namespace::from_secret("a"), Namespace::from_secret("b"));
    assert_ne!(Namespace::local(), Namespace::local());
    let ns = Namespace::from_secret("a");
    assert!(ns.owns(&ns.replica_name("m-0")));
    assert!(ns.owns(&ns.supervisor_name()));
    assert!(!Namespace::from_secret("b").owns(&ns.router_name("m")));
    assert!(!ns.owns("xinf-other/replica/m-0"));
}

#[test]
fn worker_ids_are_checked() {
    for good in ["gpu-box-1", "10.0.0.2:4000", "[::1]:4000", "rack_3.node-7"] {
        assert_eq!(check_worker_id(good).ok(), Some(good));
    }
    for bad in ["", "a b", "a/b", "ü", &"x".repeat(129)] {
        let e = check_worker_id(bad).expect_err(bad);
        assert!(matches!(&e, ActorError::InvalidConfig { field, .. } if field == "worker_id"), "{e}");
    }
}
