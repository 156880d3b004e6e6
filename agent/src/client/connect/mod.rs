//! Consul Connect on the client: what a Connect task needs besides its driver. For now the
//! Envoy bootstrap builder ([`bootstrap`]), which makes natively what Nomad gets from
//! `consul connect envoy -bootstrap` (no Consul binary on the hosts).

pub mod bootstrap;
