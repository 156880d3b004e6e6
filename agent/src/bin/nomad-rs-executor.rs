//! The per-task supervisor: see `nomad_agent::executor`.

fn main() {
    nomad_agent::executor::main()
}
