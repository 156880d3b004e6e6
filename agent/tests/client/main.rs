//! Client role tests, one binary: a real server (Raft in a temp dir) and a real client on a temp
//! dir running raw_exec tasks under real executors.

mod agent_servers;
mod artifact;
mod bad_input;
mod cleanup;
mod connect;
mod consul;
mod consul_services;
mod consul_si;
mod dns;
mod docker_network;
mod escape;
mod gc;
mod http;
mod operator;
mod reconnect;
mod register;
mod restore;
mod run;
mod services;
mod support;
mod sync;
