//! The egress allow-list: the hosts and networks that `http` steps and
//! webhooks may reach (the setting `egress-allow`).
//!
//! Off by default ([`Egress::default`]: every host). When on, a call may go
//! to a host name the list names (exactly, or under a `*.` suffix), or to
//! any host whose every address lies in a listed network (CIDR, or a bare
//! address). The check is made on the addresses the connection will use:
//! names are resolved by [`Egress::client`]'s resolver, which refuses a
//! name that resolves into an unlisted network (so a public name pointing
//! at `169.254.169.254` or `10.0.0.1` is refused too), and address literals
//! in URLs and redirects are checked before the call. Proxies from the
//! environment are ignored while the list is on: a proxy would resolve the
//! name itself, out of our sight.
//!
//! A refused call fails with [`Refused`], whose message names the host and
//! the setting; the `http` agent makes it a permanent step error and the
//! webhook sender dead-letters the delivery.
//!
//! Deliberately left out: deny-lists, ports, and schemes (the agents check
//! their own).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::{Error, Result};

/// The setting's name, as flags and config files spell it; messages name it.
pub const SETTING: &str = "egress-allow";

/// How many redirects a call follows (reqwest's own default).
const REDIRECTS_MAX: usize = 10;

/// Where outgoing calls may go. See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    /// `None`: the list is off and every host may be reached.
    list: Option<Arc<AllowList>>,
}

#[derive(Debug, PartialEq, Eq)]
struct AllowList {
    /// Lowercase names; a leading `*.` matches any name under the suffix.
    hosts: Vec<String>,
    networks: Vec<IpNet>,
}

/// A call the allow-list refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    /// The host of the URL.
    pub host: String,
    /// The address it resolved to that no listed network holds, when the
    /// host is a name.
    pub address: Option<IpAddr>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.address {
            Some(address) => write!(f, "host {} resolves to {address}, which the egress allow-list ({SETTING}) does not allow", self.host),
            None => write!(f, "host {} is not in the egress allow-list ({SETTING})", self.host),
        }
    }
}

impl Egress {
    /// An allow-list of `entries`: host names (`api.example.com`,
    /// `*.example.com`), networks (`10.1.0.0/16`, `2001:db8::/32`) or
    /// addresses. An entry that is none of these is refused, naming it.
    pub fn allow_list<S: AsRef<str>>(entries: &[S]) -> Result<Egress> {
        let mut list = AllowList { hosts: Vec::new(), networks: Vec::new() };
        for entry in entries {
            let entry = entry.as_ref().trim();
            if let Ok(network) = IpNet::from_str(entry) {
                list.networks.push(network.trunc());
            } else if let Ok(address) = IpAddr::from_str(entry) {
                list.networks.push(IpNet::from(address));
            } else if is_host_pattern(entry) {
                list.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(Error::Config(format!(
                    "{SETTING}: {entry:?} is neither a host name (api.example.com, *.example.com) nor a network (10.0.0.0/8) nor an address"
                )));
            }
        }
        if list.hosts.is_empty() && list.networks.is_empty() {
            return Err(Error::Config(format!("{SETTING}: name at least one host or network")));
        }
        Ok(Egress { list: Some(Arc::new(list)) })
    }

    /// Whether the list is on.
    pub fn is_on(&self) -> bool {
        self.list.is_some()
    }

    /// Checks the host of `url` where no resolution is needed: a listed
    /// name or an address literal. An unlisted name passes here and is
    /// checked on its addresses by the resolver.
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        let Some(list) = &self.list else { return Ok(()) };
        let host = url.host_str().unwrap_or_default();
        let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        match IpAddr::from_str(literal) {
            Ok(address) => list.check_address(literal, address, false),
            Err(_) => Ok(()),
        }
    }

    /// `builder` with the list enforced: a resolver that refuses names
    /// resolving outside it, a redirect policy that checks every hop, and
    /// no proxy. The list off, `builder` unchanged.
    pub fn client(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let Some(list) = &self.list else { return builder };
        let egress = self.clone();
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= REDIRECTS_MAX {
                return attempt.error(format!("more than {REDIRECTS_MAX} redirects"));
            }
            match egress.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        });
        builder.dns_resolver(Arc::new(Resolver { list: list.clone() })).redirect(redirects).no_proxy()
    }
}

impl AllowList {
    fn host_listed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.iter().any(|pattern| match pattern.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix) && host[..host.len() - suffix.len()].ends_with('.'),
            None => *pattern == host,
        })
    }

    fn check_address(&self, host: &str, address: IpAddr, resolved: bool) -> Result<(), Refused> {
        // An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is the IPv4 one.
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        if self.networks.iter().any(|network| network.contains(&address)) {
            Ok(())
        } else {
            Err(Refused { host: host.to_owned(), address: resolved.then_some(address) })
        }
    }
}

/// `*.` then a name, or a name: letters, digits, `-`, `.`, `_`.
fn is_host_pattern(entry: &str) -> bool {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && name.bytes().any(|b| b.is_ascii_alphabetic())
}

/// The system resolver, then the list: a listed name may resolve anywhere;
/// any other name only into listed networks (every address it resolves to).
struct Resolver {
    list: Arc<AllowList>,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let list = self.list.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !list.host_listed(&host) {
                for address in &addresses {
                    list.check_address(&host, address.ip(), true)?;
                }
            }
            let addresses: Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

/// The [`Refused`] somewhere in `error`'s chain of sources, if any.
pub fn refusal<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refused> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused);
        }
        current = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Arc<AllowList> {
        Egress::allow_list(entries).unwrap().list.unwrap()
    }

    #[test]
    fn entries_are_names_networks_or_addresses() {
        let list = list(&["API.example.com", "*.internal.example", "10.1.0.0/16", "192.0.2.7", "2001:db8::/32"]);
        assert_eq!(list.hosts, ["api.example.com", "*.internal.example"]);
        assert_eq!(list.networks.len(), 3);
        for bad in ["", "http://x", "10.0.0.0/33", "a b", "*.", ".example"] {
            let err = Egress::allow_list(&[bad]).unwrap_err().to_string();
            assert!(err.contains(SETTING), "{bad:?}: {err}");
        }
        assert!(Egress::allow_list::<&str>(&[]).is_err(), "an empty list is a mistake, not a wall");
        assert!(!Egress::default().is_on());
    }

    #[test]
    fn names_match_exactly_or_under_a_wildcard() {
        let list = list(&["api.example.com", "*.internal.example"]);
        assert!(list.host_listed("api.example.com") && list.host_listed("API.Example.com."));
        assert!(!list.host_listed("example.com") && !list.host_listed("xapi.example.com"));
        assert!(list.host_listed("a.internal.example") && list.host_listed("a.b.internal.example"));
        assert!(!list.host_listed("internal.example") && !list.host_listed("evilinternal.example"));
    }

    #[test]
    fn addresses_must_lie_in_a_listed_network() {
        let list = list(&["10.1.0.0/16", "2001:db8::/32"]);
        let check = |address: &str| list.check_address("h", address.parse().unwrap(), true);
        assert!(check("10.1.2.3").is_ok() && check("2001:db8::1").is_ok());
        assert!(check("::ffff:10.1.2.3").is_ok(), "IPv4-mapped addresses are their IPv4 address");
        let refused = check("169.254.169.254").unwrap_err();
        assert_eq!(refused.to_string(), "host h resolves to 169.254.169.254, which the egress allow-list (egress-allow) does not allow");
    }

    #[test]
    fn address_literals_in_urls_are_checked_before_the_call() {
        let egress = Egress::allow_list(&["10.0.0.0/8"]).unwrap();
        let url = |text: &str| Url::parse(text).unwrap();
        assert!(egress.check_url(&url("http://10.9.9.9/x")).is_ok());
        assert!(egress.check_url(&url("http://name.example/x")).is_ok(), "names are checked by the resolver");
        let refused = egress.check_url(&url("http://[::1]:8080/x")).unwrap_err();
        assert_eq!(refused.to_string(), "host ::1 is not in the egress allow-list (egress-allow)");
        assert!(Egress::default().check_url(&url("http://127.0.0.1/")).is_ok(), "off by default");
    }
}
