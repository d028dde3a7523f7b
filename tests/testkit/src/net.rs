//! Free loopback ports.

/// Ports are picked below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`,
/// 32768-60999 by default): a port the kernel handed out for `:0` goes back to that range
/// once released, where any outgoing connection on the machine (another test's scraper) may
/// take it before the server it was meant for binds it. A soak run's agent once found its
/// port taken so ("Address already in use").
const PICKED: std::ops::Range<u16> = 20_000..32_768;

/// A free TCP port on 127.0.0.1, tried at random in [`PICKED`] until one binds (the kernel's
/// pick for `:0` if none does).
pub fn free_port() -> u16 {
    pick(|port| std::net::TcpListener::bind(("127.0.0.1", port))?.local_addr())
}

/// A free UDP port on 127.0.0.1 (IPMI over LAN), picked as [`free_port`] picks (an outgoing
/// UDP socket's `:0` port comes from the ephemeral range as a TCP one's does).
pub fn free_udp_port() -> u16 {
    pick(|port| std::net::UdpSocket::bind(("127.0.0.1", port))?.local_addr())
}

/// The first port `bind` binds among ports tried at random in [`PICKED`], else the kernel's
/// pick for `:0`.
fn pick(bind: impl Fn(u16) -> std::io::Result<std::net::SocketAddr>) -> u16 {
    use std::hash::BuildHasher as _;
    let seed = std::collections::hash_map::RandomState::new();
    let span = u64::from(PICKED.end - PICKED.start);
    (0u64..1000)
        .map(|i| PICKED.start + (seed.hash_one((std::process::id(), i)) % span) as u16)
        .find(|&port| bind(port).is_ok())
        .unwrap_or_else(|| bind(0).expect("bind a free loopback port").port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_can_be_bound() {
        for _ in 0..20 {
            let port = free_port();
            assert!(PICKED.contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("bindable");
            let port = free_udp_port();
            assert!(PICKED.contains(&port), "{port}");
            std::net::UdpSocket::bind(("127.0.0.1", port)).expect("bindable");
        }
    }
}
