//! The network policy of the `net` tools: which URLs a guest's request may name, which
//! addresses a connection may reach, and the secrets the host puts into a request on the
//! guest's behalf.
//!
//! Everything here is a pure decision over values, unit-tested without a socket; the tool
//! that makes requests applies it at three points:
//!
//! 1. [`NetPolicy::check_url`] before anything is resolved: the scheme (`http`, `https`), no
//!    credentials in the URL, and the host on the allowlist ([`HostPattern`]). URLs are parsed
//!    as browsers parse them (the `url` crate, WHATWG), so `http://2130706433/` and
//!    `http://0x7f.1/` are the IPv4 address they spell and are checked as such.
//! 2. [`NetPolicy::check_address`] on every address DNS gives, before connecting: loopback,
//!    private, link-local (cloud metadata), shared, multicast and reserved ranges are refused
//!    unless [`NetPolicy::allow_address`] lets a range through (tests allow `127.0.0.1` for
//!    their own server), and IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64,
//!    6to4) are judged by that address.
//! 3. [`Secrets::substitute`] on the URL and header values of a request whose target passed
//!    (1): a placeholder (`PYCAGE_SECRET_NAME`) becomes the secret's value only for a host the
//!    secret is bound to; for any other host the request is refused. [`Secrets::redact`]
//!    turns a value back into its placeholder in anything returned to the guest or logged.
//!
//! Deny by default: an empty [`NetPolicy`] allows no host.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;
use url::{Host, Url};

pub mod config;
pub mod fetch;

pub use config::{NetConfig, SecretConfig};
pub use fetch::{FetchLimits, FetchTool, install_crypto_provider};

/// The prefix of a secret's placeholder: `PYCAGE_SECRET_` and the secret's name.
pub const PLACEHOLDER_PREFIX: &str = "PYCAGE_SECRET_";

/// Why a request, or a connection, is refused. The message is shown to the guest: it names
/// the host or address the guest itself gave, never a secret's value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetError {
    /// The URL does not parse, or has no host.
    BadUrl(String),
    /// A scheme other than `http` and `https`.
    Scheme(String),
    /// A user name or password in the URL (`http://user@host/`).
    Credentials,
    /// The host (and port, and scheme) is not on the allowlist.
    NotAllowed(String),
    /// The address the host resolved to, or the host's own address, is in a range that is
    /// not reachable from the sandbox (loopback, private, link-local, ...).
    Address(IpAddr),
    /// A secret's placeholder in a request to a host the secret is not bound to.
    SecretNotForHost {
        /// The secret's name.
        secret: String,
        /// The host the request was for.
        host: String,
    },
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::BadUrl(why) => write!(f, "not a URL: {why}"),
            NetError::Scheme(scheme) => {
                write!(f, "scheme `{scheme}` is not allowed: only http and https")
            }
            NetError::Credentials => f.write_str(
                "a user name or password in the URL is not allowed: send credentials in a \
                 header",
            ),
            NetError::NotAllowed(target) => {
                write!(f, "{target} is not on the network allowlist")
            }
            NetError::Address(addr) => write!(
                f,
                "{addr} is a loopback, private, link-local or reserved address: not reachable \
                 from the sandbox"
            ),
            NetError::SecretNotForHost { secret, host } => write!(
                f,
                "secret {secret} may not be sent to {host}: it is bound to other hosts"
            ),
        }
    }
}

impl std::error::Error for NetError {}

/// The scheme of a request: `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

impl Scheme {
    fn parse(scheme: &str) -> Option<Scheme> {
        match scheme {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }

    /// The port a URL of this scheme means when it names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// Where a request goes, as its URL says: what the allowlist and the secrets are matched on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The scheme.
    pub scheme: Scheme,
    /// The host as the URL parser normalized it: a lowercase domain without a trailing dot,
    /// or an IP address.
    pub host: TargetHost,
    /// The port, the scheme's default when the URL names none.
    pub port: u16,
}

/// A target's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    /// A domain name, to be resolved.
    Domain(String),
    /// An address literal (`127.0.0.1`, `[::1]`, and `2130706433`, which parses as one).
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Domain(name) => f.write_str(name),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            TargetHost::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// One allowlist entry: `example.com`, `*.example.com` (its subdomains, not itself),
/// `127.0.0.1`, `[::1]`, each optionally with `:PORT` and a leading `http://` or `https://`.
/// Without a port any port matches; without a scheme both do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    scheme: Option<Scheme>,
    host: HostMatch,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostMatch {
    Exact(TargetHost),
    /// `*.example.com`: a name that ends with `.example.com`.
    Subdomains(String),
}

impl FromStr for HostPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<HostPattern, String> {
        let bad = |why: &str| format!("{text:?} is not a host pattern: {why}");
        let trimmed = text.trim();
        let (scheme, rest) = match trimmed.split_once("://") {
            Some((scheme, rest)) => (
                Some(Scheme::parse(scheme).ok_or_else(|| bad("the scheme is not http or https"))?),
                rest,
            ),
            None => (None, trimmed),
        };
        if rest.contains(['/', '@', '?', '#']) || rest.is_empty() {
            return Err(bad("give a host, optionally with :PORT (no path or user)"));
        }
        let (wildcard, rest) = match rest.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        // Parsed as the host of a URL would be, so a pattern and a request agree on what a
        // name or an address is.
        let url = Url::parse(&format!("http://{rest}/")).map_err(|e| bad(&e.to_string()))?;
        let port = url.port();
        let host = match url.host() {
            Some(Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_owned();
                if name.is_empty() || name.contains('*') {
                    return Err(bad(
                        "a wildcard may only open the pattern, as *.example.com",
                    ));
                }
                if wildcard {
                    HostMatch::Subdomains(name)
                } else {
                    HostMatch::Exact(TargetHost::Domain(name))
                }
            }
            Some(Host::Ipv4(ip)) if !wildcard => HostMatch::Exact(TargetHost::Ip(IpAddr::V4(ip))),
            Some(Host::Ipv6(ip)) if !wildcard => HostMatch::Exact(TargetHost::Ip(IpAddr::V6(ip))),
            _ => return Err(bad("a wildcard needs a domain after it")),
        };
        Ok(HostPattern { scheme, host, port })
    }
}

impl HostPattern {
    /// True when `target` is what this pattern allows.
    pub fn matches(&self, target: &Target) -> bool {
        if self.scheme.is_some_and(|s| s != target.scheme)
            || self.port.is_some_and(|p| p != target.port)
        {
            return false;
        }
        match (&self.host, &target.host) {
            (HostMatch::Exact(host), target) => host == target,
            (HostMatch::Subdomains(suffix), TargetHost::Domain(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostMatch::Subdomains(_), TargetHost::Ip(_)) => false,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scheme {
            Some(Scheme::Http) => f.write_str("http://")?,
            Some(Scheme::Https) => f.write_str("https://")?,
            None => {}
        }
        match &self.host {
            HostMatch::Exact(host) => write!(f, "{host}")?,
            HostMatch::Subdomains(suffix) => write!(f, "*.{suffix}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// The hosts a run may reach, and the address ranges let through despite being internal.
/// The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetPolicy {
    allow: Vec<HostPattern>,
    addresses: Vec<IpNet>,
}

impl NetPolicy {
    /// A policy that allows no host.
    pub fn new() -> NetPolicy {
        NetPolicy::default()
    }

    /// Allows the hosts `pattern` matches.
    #[must_use]
    pub fn allow(mut self, pattern: HostPattern) -> NetPolicy {
        self.allow.push(pattern);
        self
    }

    /// Lets connections reach `range` although it is internal (loopback, private, ...): for
    /// a service of the host's own that a run is meant to use. The host must still be on the
    /// allowlist.
    #[must_use]
    pub fn allow_address(mut self, range: IpNet) -> NetPolicy {
        self.addresses.push(range);
        self
    }

    /// The allowlist.
    pub fn hosts(&self) -> &[HostPattern] {
        &self.allow
    }

    /// True when no host is allowed: the `net` tools should not be exposed.
    pub fn is_closed(&self) -> bool {
        self.allow.is_empty()
    }

    /// This policy narrowed to the hosts that `other` allows too: a run's own allowlist
    /// within the runner's. A pattern of this policy stays when one of `other`'s is equal to
    /// it; a run cannot widen what the runner allows.
    #[must_use]
    pub fn narrowed_to(&self, other: &[HostPattern]) -> NetPolicy {
        NetPolicy {
            allow: self
                .allow
                .iter()
                .filter(|p| other.contains(p))
                .cloned()
                .collect(),
            addresses: self.addresses.clone(),
        }
    }

    /// Checks a request's URL (step 1 of the [module docs](self)) and returns its target.
    ///
    /// # Errors
    ///
    /// [`NetError`]: the URL, its scheme, credentials in it, a host not allowed, or an
    /// address literal in a range not reachable.
    pub fn check_url(&self, url: &str) -> Result<(Url, Target), NetError> {
        let url = Url::parse(url).map_err(|e| NetError::BadUrl(e.to_string()))?;
        let target = target_of(&url)?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(NetError::Credentials);
        }
        if !self.allow.iter().any(|p| p.matches(&target)) {
            return Err(NetError::NotAllowed(target.to_string()));
        }
        if let TargetHost::Ip(ip) = target.host {
            self.check_address(ip)?;
        }
        Ok((url, target))
    }

    /// Checks an address a connection would go to (step 2 of the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`NetError::Address`] for an internal address no [`allow_address`](Self::allow_address)
    /// range holds.
    pub fn check_address(&self, ip: IpAddr) -> Result<(), NetError> {
        if self.addresses.iter().any(|range| range.contains(&ip)) || is_public(ip) {
            Ok(())
        } else {
            Err(NetError::Address(ip))
        }
    }
}

/// The target of a parsed URL.
///
/// # Errors
///
/// [`NetError::Scheme`] or [`NetError::BadUrl`] (no host).
pub fn target_of(url: &Url) -> Result<Target, NetError> {
    let scheme =
        Scheme::parse(url.scheme()).ok_or_else(|| NetError::Scheme(url.scheme().to_owned()))?;
    let host = match url.host() {
        Some(Host::Domain(name)) => TargetHost::Domain(name.trim_end_matches('.').to_owned()),
        Some(Host::Ipv4(ip)) => TargetHost::Ip(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => TargetHost::Ip(IpAddr::V6(ip)),
        None => return Err(NetError::BadUrl("it has no host".into())),
    };
    Ok(Target {
        scheme,
        host,
        port: url.port().unwrap_or(scheme.default_port()),
    })
}

/// True for an address on the public internet: none of the special-purpose ranges of the
/// IANA registries (RFC 6890 and its updates) that a sandbox must not reach by default.
///
/// Written here because `IpAddr::is_global` is not stable on Rust 1.95 and `ipnet` has no
/// such test; the table of `internal_ranges_are_not_public` pins every range.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || a == 0 // "this network"
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: cloud metadata services live here
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || ip.is_multicast()
        || a >= 240) // reserved, and the broadcast address
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unique_local() // fc00::/7
        || ip.is_unicast_link_local() // fe80::/10
        || (segments[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (segments[0] == 0x2001 && segments[1] == 0x0db8) // documentation
        // IETF protocol assignments (2001::/23): Teredo (tunnels to anywhere), benchmarking,
        // ORCHID and the rest; none is a web server's address.
        || (segments[0] == 0x2001 && segments[1] < 0x0200)
        || (segments[0] == 0x0064 && segments[1] == 0xff9b && segments[2] == 1) // local-use NAT64
        || (segments[0] == 0x0100 && segments[1..4] == [0, 0, 0]) // discard-only
        || segments[0] == 0x5f00) // segment routing
}

/// The IPv4 address an IPv6 address carries, in the forms a connection could reach it by:
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), IPv4-translated
/// (`::ffff:0:a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    match s {
        // `::` and `::1` are IPv6's own unspecified and loopback addresses.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        // IPv4-translated (`::ffff:0:a.b.c.d`, SIIT).
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(v4(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        _ => None,
    }
}

/// A value the host puts into requests in place of a placeholder, for the hosts it is bound
/// to. Its `Debug` form never shows the value.
#[derive(Clone)]
pub struct Secret {
    name: String,
    value: String,
    hosts: Vec<HostPattern>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl Secret {
    /// A secret named `name` (`A-Z`, `0-9`, `_`, starting with a letter), worth `value`,
    /// sent only to the hosts of `hosts`.
    ///
    /// # Errors
    ///
    /// A message when the name is not of that form, the value is empty, or no host is given.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        hosts: Vec<HostPattern>,
    ) -> Result<Secret, String> {
        let name = name.into();
        let value = value.into();
        let well_formed = name.starts_with(|c: char| c.is_ascii_uppercase())
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !well_formed {
            return Err(format!(
                "secret name {name:?}: use A-Z, 0-9 and _, starting with a letter"
            ));
        }
        if value.is_empty() {
            return Err(format!("secret {name}: the value is empty"));
        }
        if hosts.is_empty() {
            return Err(format!(
                "secret {name}: bind it to the hosts it may be sent to"
            ));
        }
        Ok(Secret { name, value, hosts })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the guest writes in its place: `PYCAGE_SECRET_` and the name.
    pub fn placeholder(&self) -> String {
        format!("{PLACEHOLDER_PREFIX}{}", self.name)
    }

    /// The hosts it may be sent to.
    pub fn hosts(&self) -> &[HostPattern] {
        &self.hosts
    }
}

/// The secrets of a runner.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    secrets: Vec<Secret>,
}

impl Secrets {
    /// No secrets.
    pub fn new() -> Secrets {
        Secrets::default()
    }

    /// Adds `secret`; a later secret of the same name replaces an earlier one.
    #[must_use]
    pub fn with(mut self, secret: Secret) -> Secrets {
        self.secrets.retain(|s| s.name != secret.name);
        self.secrets.push(secret);
        // Longest names first, so that `PYCAGE_SECRET_KEY_2` is not read as `..._KEY` and "_2".
        self.secrets
            .sort_by(|a, b| b.name.len().cmp(&a.name.len()).then(a.name.cmp(&b.name)));
        self
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The secrets (names and hosts; the values stay inside).
    pub fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.secrets.iter()
    }

    /// `text` (a URL or a header value of a request to `target`) with every placeholder of a
    /// secret bound to `target` replaced by the secret's value.
    ///
    /// # Errors
    ///
    /// [`NetError::SecretNotForHost`] when `text` holds the placeholder of a secret that is
    /// not bound to `target`: the request must not go.
    pub fn substitute(&self, text: &str, target: &Target) -> Result<String, NetError> {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            let placeholder = secret.placeholder();
            if !out.contains(&placeholder) {
                continue;
            }
            if !secret.hosts.iter().any(|h| h.matches(target)) {
                return Err(NetError::SecretNotForHost {
                    secret: secret.name.clone(),
                    host: target.to_string(),
                });
            }
            out = out.replace(&placeholder, &secret.value);
        }
        Ok(out)
    }

    /// True when a secret is bound to `target`: its responses may hold a value (the request
    /// carried it, or the host knows it), so they must come in a form redaction can read.
    pub fn bound_to(&self, target: &Target) -> bool {
        self.secrets
            .iter()
            .any(|s| s.hosts.iter().any(|h| h.matches(target)))
    }

    /// True when `text` holds a secret's value as it is or percent-decoded (a URL's form of
    /// it), after [`redact`](Self::redact) had its chance: a form redaction cannot undo.
    pub fn revealed_in(&self, text: &str) -> bool {
        let decoded = url::form_urlencoded::parse(text.as_bytes())
            .flat_map(|(k, v)| [k.into_owned(), v.into_owned()])
            .collect::<Vec<_>>()
            .join("\n");
        self.secrets
            .iter()
            .any(|s| text.contains(&s.value) || decoded.contains(&s.value))
    }

    /// `text` with every secret's value replaced by its placeholder: for what goes back to
    /// the guest (a response that echoes a header, an error) and what is logged.
    pub fn redact(&self, text: &str) -> String {
        let mut by_length: Vec<&Secret> = self.secrets.iter().collect();
        // A value that holds another's is replaced first, whole.
        by_length.sort_by_key(|s| std::cmp::Reverse(s.value.len()));
        let mut out = text.to_owned();
        for secret in by_length {
            if out.contains(&secret.value) {
                out = out.replace(&secret.value, &secret.placeholder());
            }
        }
        out
    }

    /// As [`redact`](Self::redact), over bytes that are not text (a binary response body,
    /// which the guest gets as base64 and could decode).
    pub fn redact_bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut by_length: Vec<&Secret> = self.secrets.iter().collect();
        by_length.sort_by_key(|s| std::cmp::Reverse(s.value.len()));
        let mut out = bytes;
        for secret in by_length {
            let value = secret.value.as_bytes();
            if memchr::memmem::find(&out, value).is_none() {
                continue;
            }
            let placeholder = secret.placeholder();
            let mut replaced = Vec::with_capacity(out.len());
            let mut rest = 0;
            for at in memchr::memmem::find_iter(&out, value) {
                // Matches may overlap; each starts after the last one replaced.
                if at < rest {
                    continue;
                }
                replaced.extend_from_slice(&out[rest..at]);
                replaced.extend_from_slice(placeholder.as_bytes());
                rest = at + value.len();
            }
            replaced.extend_from_slice(&out[rest..]);
            out = replaced;
        }
        out
    }
}

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
