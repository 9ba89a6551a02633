fn main() -> std::process::ExitCode {
    vaultfs::cli::main()
}
