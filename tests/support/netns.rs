//! A small lab of Linux network namespaces (`ip netns`) for partition tests: one namespace per
//! node, wired through bridges in a hub namespace, with a link between the bridges that can be
//! cut and healed.
//!
//! ```text
//!   node ns pw<pid>n0 ─┐                     ┌─ node ns pw<pid>n2
//!   node ns pw<pid>n1 ─┴─ br0 ══ x0|x1 ══ br1 ┴─ node ns pw<pid>n3     (hub ns pw<pid>h)
//! ```
//!
//! - **Data network** (libp2p): 10.77.0.0/24 on `eth0` in every node namespace, bridged in the
//!   hub namespace. Side `s` of the lab is bridge `br<s>`; the bridges are joined by the veth
//!   pair `x<s>`, in a line (`x0` joins `br0` and `br1`, …). [`Lab::cut`] sets a pair down:
//!   the sides on either end no longer reach each other, while each side stays connected
//!   within. The data network lives entirely inside the lab's namespaces.
//! - **Control network** (the HTTP API, so that the test process can reach every node at all
//!   times, partition or not): one veth pair per node between the host namespace (`pw<pid>c<k>`)
//!   and the node's namespace (`ctl0`), a /30 of its own in a /24 derived from the test's pid.
//!   Node namespaces have no default route and no route to each other's /30, so nodes cannot
//!   reach each other through it.
//!
//! Everything is deleted when the [`Lab`] is dropped (even when the test panics); node
//! processes running in it must be killed before that, so declare the lab before the nodes.
//! Labs left over by a test process that died (its pid is gone) are cleaned up when a new lab
//! is made.

use std::process::Command;

/// One node's place in the lab.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Its namespace.
    pub ns: String,
    /// Its side (bridge).
    pub side: usize,
    /// Its data address (libp2p).
    pub data_ip: String,
    /// Its control address (the HTTP API), reachable from the host namespace.
    pub ctl_ip: String,
}

/// Network namespaces for a partitionable cluster; deleted on drop.
#[derive(Debug)]
pub struct Lab {
    tag: String,
    hub: String,
    /// Node slots, side by side.
    pub slots: Vec<Slot>,
    sides: usize,
    host_links: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The pid in a namespace name made by [`Lab::new`] (`pw<pid>h`, `pw<pid>n<k>`), if it is one.
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("pw")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let tail = &rest[digits.len()..];
    let ours = tail == "h"
        || tail
            .strip_prefix('n')
            .is_some_and(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()));
    if ours { digits.parse().ok() } else { None }
}

/// Deletes the namespaces of labs whose test process is gone (killed before it could clean
/// up), and the node processes left running in them.
fn clean_stale() {
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = owner(name) else { continue };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        for p in ip_output(&["netns", "pids", name]).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", p]).status();
        }
        let _ = ip(&["netns", "del", name]);
    }
}

impl Lab {
    /// Whether this machine lets the test make network namespaces (root, and a kernel that
    /// allows it): tries to make and delete one. Err says why not.
    pub fn available() -> Result<(), String> {
        let probe = format!("pw{}n999", std::process::id());
        ip(&["netns", "add", &probe])?;
        let veth = ip(&[
            "-n", &probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1",
        ]);
        let _ = ip(&["netns", "del", &probe]);
        veth
    }

    /// A lab with `sides[s]` nodes on side `s`, all sides joined.
    pub fn new(sides: &[usize]) -> Result<Lab, String> {
        clean_stale();
        let pid = std::process::id();
        let tag = format!("pw{pid}");
        let mut lab = Lab {
            hub: format!("{tag}h"),
            tag,
            slots: vec![],
            sides: sides.len(),
            host_links: vec![],
        };
        // On error, dropping `lab` deletes whatever was made.
        lab.build(sides, pid)?;
        Ok(lab)
    }

    fn build(&mut self, sides: &[usize], pid: u32) -> Result<(), String> {
        let hub = self.hub.clone();
        let _ = ip(&["netns", "del", &hub]);
        ip(&["netns", "add", &hub])?;
        for s in 0..sides.len() {
            let br = format!("br{s}");
            ip(&["-n", &hub, "link", "add", "name", &br, "type", "bridge"])?;
            ip(&["-n", &hub, "link", "set", &br, "up"])?;
        }
        for s in 1..sides.len() {
            let (a, b) = (format!("x{}a", s - 1), format!("x{}b", s - 1));
            ip(&[
                "-n", &hub, "link", "add", "name", &a, "type", "veth", "peer", "name", &b,
            ])?;
            ip(&[
                "-n",
                &hub,
                "link",
                "set",
                &a,
                "master",
                &format!("br{}", s - 1),
            ])?;
            ip(&["-n", &hub, "link", "set", &b, "master", &format!("br{s}")])?;
            ip(&["-n", &hub, "link", "set", &a, "up"])?;
            ip(&["-n", &hub, "link", "set", &b, "up"])?;
        }
        // The control /24: 10.<200..250>.<0..256>.0, from the pid, so that concurrent test
        // processes do not collide.
        let (c1, c2) = (200 + (pid / 256) % 50, pid % 256);
        let mut k = 0u32;
        for (side, &n) in sides.iter().enumerate() {
            for _ in 0..n {
                let ns = format!("{}n{k}", self.tag);
                let _ = ip(&["netns", "del", &ns]);
                ip(&["netns", "add", &ns])?;
                let slot = Slot {
                    ns: ns.clone(),
                    side,
                    data_ip: format!("10.77.0.{}", k + 1),
                    ctl_ip: format!("10.{c1}.{c2}.{}", 4 * k + 2),
                };
                self.slots.push(slot.clone());
                ip(&["-n", &ns, "link", "set", "lo", "up"])?;
                // Data: eth0 in the node's namespace, p<k> on the side's bridge in the hub.
                let port = format!("p{k}");
                ip(&[
                    "-n", &hub, "link", "add", "name", &port, "type", "veth", "peer", "name",
                    "eth0", "netns", &ns,
                ])?;
                ip(&[
                    "-n",
                    &hub,
                    "link",
                    "set",
                    &port,
                    "master",
                    &format!("br{side}"),
                ])?;
                ip(&["-n", &hub, "link", "set", &port, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", slot.data_ip),
                    "dev",
                    "eth0",
                ])?;
                ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
                // Control: pw<pid>c<k> in the host namespace, ctl0 in the node's.
                let host = format!("{}c{k}", self.tag);
                let _ = ip(&["link", "del", &host]);
                ip(&[
                    "link", "add", "name", &host, "type", "veth", "peer", "name", "ctl0", "netns",
                    &ns,
                ])?;
                self.host_links.push(host.clone());
                let host_ip = format!("10.{c1}.{c2}.{}/30", 4 * k + 1);
                ip(&["addr", "add", &host_ip, "dev", &host])?;
                ip(&["link", "set", &host, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/30", slot.ctl_ip),
                    "dev",
                    "ctl0",
                ])?;
                ip(&["-n", &ns, "link", "set", "ctl0", "up"])?;
                k += 1;
            }
        }
        Ok(())
    }

    fn set_link(&self, between: usize, state: &str) -> Result<(), String> {
        assert!(between + 1 < self.sides, "no link after side {between}");
        for end in ["a", "b"] {
            ip(&[
                "-n",
                &self.hub,
                "link",
                "set",
                &format!("x{between}{end}"),
                state,
            ])?;
        }
        Ok(())
    }

    /// Cuts the link between side `between` and side `between + 1`.
    pub fn cut(&self, between: usize) {
        self.set_link(between, "down").expect("cut the link");
    }

    /// Restores the link between side `between` and side `between + 1`.
    pub fn heal(&self, between: usize) {
        self.set_link(between, "up").expect("heal the link");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for slot in &self.slots {
            if let Err(e) = ip(&["netns", "del", &slot.ns]) {
                eprintln!("lab cleanup: {e}");
            }
        }
        let _ = ip(&["netns", "del", &self.hub]);
        for link in &self.host_links {
            // Normally gone with its peer already.
            let _ = ip(&["link", "del", link]);
        }
    }
}
