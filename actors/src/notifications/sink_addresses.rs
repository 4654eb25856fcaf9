//! Where the sinks' HTTP client may connect: every address a sink's host resolves to is judged by
//! [`SinkAddressPolicy`] before a connection is made, and a host written as an address is judged before
//! the request is sent. Names are resolved at each connection, so a name that later resolves to an
//! address the manager may not reach (DNS rebinding) is caught there. No proxy is used: the address
//! connected to is the sink's own.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::engine::notifications::sink_address::SinkAddressPolicy;

/// A sink's host resolved, or was written, to addresses the manager may not reach.
#[derive(Debug, thiserror::Error)]
#[error(
    "{host} is {address}, a {reason} address: sinks reach only public addresses unless \
     --notification-sink-allowed-cidrs lists it"
)]
pub struct SinkAddressRefused {
    pub host: String,
    pub address: IpAddr,
    pub reason: &'static str,
}

/// Resolves sinks' hosts and keeps only the addresses `policy` allows.
pub struct SinkResolver {
    pub policy: Arc<SinkAddressPolicy>,
}

impl Resolve for SinkResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (allowed, refused) = judge(&policy, &host, resolved);
            match refused {
                Some(refused) if allowed.is_empty() => Err(refused.into()),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// The addresses `policy` allows of those `host` resolved to, and the first it refused.
fn judge(
    policy: &SinkAddressPolicy,
    host: &str,
    resolved: Vec<SocketAddr>,
) -> (Vec<SocketAddr>, Option<SinkAddressRefused>) {
    let mut refused = None;
    let allowed = resolved
        .into_iter()
        .filter(|address| match policy.refusal(address.ip()) {
            None => true,
            Some(reason) => {
                refused.get_or_insert_with(|| SinkAddressRefused {
                    host: host.to_owned(),
                    address: address.ip(),
                    reason,
                });
                false
            }
        })
        .collect();
    (allowed, refused)
}

/// The refusal of `url` when its host is written as an address the policy refuses (the client does not
/// resolve those).
pub fn literal_refusal(policy: &SinkAddressPolicy, url: &str) -> Option<SinkAddressRefused> {
    let parsed = url::Url::parse(url).ok()?;
    let address = match parsed.host()? {
        url::Host::Ipv4(v4) => IpAddr::V4(v4),
        url::Host::Ipv6(v6) => IpAddr::V6(v6),
        url::Host::Domain(_) => return None,
    };
    policy.refusal(address).map(|reason| SinkAddressRefused {
        host: parsed.host_str().unwrap_or_default().to_owned(),
        address,
        reason,
    })
}

/// The address refusal somewhere in `error`'s sources, if that is why a request failed.
pub fn address_refusal<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a SinkAddressRefused> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(refused) = error.downcast_ref::<SinkAddressRefused>() {
            return Some(refused);
        }
        cause = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_by_default() {
        // The machine's own resolver: `localhost` is loopback on every host.
        let resolver = SinkResolver {
            policy: Arc::new(SinkAddressPolicy::default()),
        };
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addresses) => panic!("resolved to {:?}", addresses.collect::<Vec<_>>()),
            Err(error) => error,
        };
        let refused = address_refusal(error.as_ref()).unwrap();
        assert_eq!(refused.reason, "loopback");
        assert!(
            refused
                .to_string()
                .contains("--notification-sink-allowed-cidrs"),
            "{refused}"
        );
        let allowed = SinkResolver {
            policy: Arc::new(
                SinkAddressPolicy::parse(&["127.0.0.0/8".to_owned(), "::1/128".to_owned()])
                    .unwrap(),
            ),
        };
        let addresses: Vec<SocketAddr> = allowed
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addresses.iter().all(|a| a.ip().is_loopback()) && !addresses.is_empty());
    }

    /// Through the sinks' own client: the refusal is what the request fails with, found in its sources.
    #[tokio::test]
    async fn the_sinks_client_fails_a_request_to_a_refused_name_with_the_refusal() {
        let client = crate::notifications::sink_delivery::sink_http_client(Arc::new(
            SinkAddressPolicy::default(),
        ))
        .unwrap();
        let error = client
            .post("http://localhost:9/never")
            .send()
            .await
            .unwrap_err();
        let refused = address_refusal(&error).unwrap_or_else(|| panic!("{error:?}"));
        assert_eq!(
            (refused.host.as_str(), refused.reason),
            ("localhost", "loopback")
        );
    }

    #[test]
    fn only_allowed_addresses_are_connected_to() {
        let policy = SinkAddressPolicy::default();
        let resolved = vec![
            "10.0.0.1:0".parse().unwrap(),
            "93.184.215.14:0".parse().unwrap(),
        ];
        let (allowed, refused) = judge(&policy, "mixed.example", resolved);
        assert_eq!(
            allowed,
            vec!["93.184.215.14:0".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(refused.unwrap().reason, "private");
    }

    #[test]
    fn hosts_written_as_addresses_are_judged_too() {
        let policy = SinkAddressPolicy::default();
        let refused = literal_refusal(&policy, "http://169.254.169.254/latest").unwrap();
        assert_eq!(refused.reason, "link-local");
        assert_eq!(
            literal_refusal(&policy, "http://[::ffff:127.0.0.1]:9090/-/quit")
                .unwrap()
                .reason,
            "loopback"
        );
        assert!(literal_refusal(&policy, "https://hooks.example.com/x").is_none());
        assert!(literal_refusal(&policy, "https://93.184.215.14/x").is_none());
    }
}
