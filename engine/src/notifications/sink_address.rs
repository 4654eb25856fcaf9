//! Which addresses the manager may deliver a notification sink's events to. Whoever may edit a
//! HostedClusterPackage writes a sink's URL, and the manager POSTs from inside the cluster network, so
//! by default only public addresses are reached: loopback, link-local (cloud metadata services),
//! private, shared (carrier-grade NAT), unspecified, multicast, broadcast, reserved, documentation and
//! benchmarking ranges are refused, and IPv6 addresses embedding an IPv4 one are judged by it. Pod and
//! Service ranges are private on every usual cluster; the operator allows ranges with
//! `--notification-sink-allowed-cidrs`. The check is made on each address the manager connects to,
//! after name resolution, so a name that resolves elsewhere later is caught.
//!
//! Pure: no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The operator's allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkAddressPolicy {
    allowed: Vec<IpNet>,
}

impl SinkAddressPolicy {
    pub fn new(allowed: Vec<IpNet>) -> Self {
        Self { allowed }
    }

    /// The policy of `--notification-sink-allowed-cidrs` (`10.0.0.0/8,fd00::/8`).
    pub fn parse(cidrs: &[String]) -> Result<Self, String> {
        let allowed = cidrs
            .iter()
            .map(|cidr| {
                cidr.trim().parse::<IpNet>().map_err(|_| {
                    format!("--notification-sink-allowed-cidrs: {cidr:?} is not a CIDR (10.0.0.0/8, fd00::/8)")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { allowed })
    }

    /// Why the manager may not deliver to `address`; `None` when it may.
    pub fn refusal(&self, address: IpAddr) -> Option<&'static str> {
        let address = address.to_canonical();
        if self.allowed.iter().any(|net| net.contains(&address)) {
            return None;
        }
        match address {
            IpAddr::V4(v4) => v4_refusal(v4),
            IpAddr::V6(v6) => v6_refusal(v6),
        }
    }
}

fn v4_refusal(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = address.octets();
    Some(match (a, b, c) {
        _ if address.is_loopback() => "loopback",
        _ if address.is_private() => "private",
        _ if address.is_link_local() => "link-local",
        (0, _, _) => "unspecified",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (192, 0, 0) => "IETF protocol",
        _ if address.is_documentation() => "documentation",
        (198, 18..=19, _) => "benchmarking",
        _ if address.is_multicast() => "multicast",
        (240..=255, _, _) => "reserved or broadcast",
        _ => return None,
    })
}

fn v6_refusal(address: Ipv6Addr) -> Option<&'static str> {
    let segments = address.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address that a gateway reaches.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., hi, lo] = segments;
        return v4_refusal(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    if segments[0] == 0x2002 {
        return v4_refusal(Ipv4Addr::from(
            (u32::from(segments[1]) << 16) | u32::from(segments[2]),
        ));
    }
    Some(match segments[0] {
        _ if address.is_loopback() => "loopback",
        _ if address.is_unspecified() => "unspecified",
        _ if address.is_unique_local() => "private (unique local)",
        _ if address.is_unicast_link_local() => "link-local",
        _ if address.is_multicast() => "multicast",
        0x2001 if segments[1] == 0x0db8 => "documentation",
        // Anything else outside global unicast (2000::/3): reserved.
        first if !(0x2000..=0x3fff).contains(&first) => "reserved",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn refused(policy: &SinkAddressPolicy, address: &str) -> Option<&'static str> {
        policy.refusal(address.parse().unwrap())
    }

    #[test]
    fn only_public_addresses_by_default() {
        let policy = SinkAddressPolicy::default();
        for (address, why) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.128.0.7", "private"),
            ("172.30.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved or broadcast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a00:1", "private"),
            ("2002:7f00:1::", "loopback"),
            ("fd00::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
        ] {
            assert_eq!(refused(&policy, address), Some(why), "{address}");
        }
        for public in [
            "93.184.215.14",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert_eq!(refused(&policy, public), None, "{public}");
        }
    }

    #[test]
    fn the_operator_allows_ranges_and_nothing_else() {
        let policy =
            SinkAddressPolicy::parse(&["10.0.0.0/8".to_owned(), " fd00::/8".to_owned()]).unwrap();
        assert_eq!(refused(&policy, "10.1.2.3"), None);
        assert_eq!(refused(&policy, "::ffff:10.1.2.3"), None);
        assert_eq!(refused(&policy, "fd12::1"), None);
        assert_eq!(refused(&policy, "192.168.0.1"), Some("private"));
        assert_eq!(refused(&policy, "127.0.0.1"), Some("loopback"));
        let error = SinkAddressPolicy::parse(&["10.0.0.0/33".to_owned()]).unwrap_err();
        assert!(error.contains("\"10.0.0.0/33\" is not a CIDR"), "{error}");
    }

    proptest! {
        /// An IPv4 address is judged the same written as itself, IPv4-mapped, or behind NAT64.
        #[test]
        fn embedded_ipv4_is_judged_as_itself(bits: u32) {
            let policy = SinkAddressPolicy::default();
            let v4 = Ipv4Addr::from(bits);
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            let [a, b, c, d] = v4.octets();
            let nat64 = IpAddr::V6(Ipv6Addr::new(
                0x64, 0xff9b, 0, 0, 0, 0,
                u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]),
            ));
            let own = policy.refusal(IpAddr::V4(v4));
            prop_assert_eq!(policy.refusal(mapped), own);
            prop_assert_eq!(policy.refusal(nat64), own);
        }
    }
}
