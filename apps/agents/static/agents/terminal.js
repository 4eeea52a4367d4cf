/* The Studio's terminal page (AgentAdmin.terminal_view): xterm.js on ws/agents/<id>/pty/.
 *
 * The protocol is AgentTerminalConsumer's (apps/agents/consumers.py): keystrokes go out as
 * binary frames, a new size as {"type": "resize", "cols", "rows"}; the terminal's output comes
 * in as binary frames, and JSON messages say "opened", "exit" or "error". #terminal-status
 * shows where things are; its data-state is one of loading, connecting, opened, exited
 * (the program ended), refused (the server said no) and closed (the connection dropped).
 * Once a terminal is over, Reconnect opens a new one (a new shell, not the old one).
 */
(function () {
    "use strict";

    const page = document.getElementById("terminal-page");
    if (!page || typeof Terminal === "undefined" || typeof FitAddon === "undefined") {
        return;
    }
    const statusLine = document.getElementById("terminal-status");
    const reconnectButton = document.getElementById("terminal-reconnect");
    const screen = document.getElementById("terminal-screen");
    const encoder = new TextEncoder();
    // The consumer refuses input frames over 64 KiB; a large paste goes in slices.
    const MAX_INPUT_FRAME = 60 * 1024;
    const OVER = new Set(["exited", "refused", "closed"]);

    const term = new Terminal({
        cursorBlink: true,
        scrollback: 5000,
        fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace',
        fontSize: 14,
    });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(screen);

    let socket = null;
    let state = "loading";
    let openedText = "";

    function setStatus(newState, text) {
        state = newState;
        statusLine.dataset.state = newState;
        statusLine.textContent = text;
        reconnectButton.hidden = !OVER.has(newState);
        term.options.disableStdin = OVER.has(newState);
    }

    // The screen fills the window below its top (never less than its CSS min-height); the fit
    // addon turns its pixels into columns and rows, and a change of those is a resize (below).
    // Below the screen: the content's padding and the admin's clearing line break (36px).
    const BELOW = 40;
    function layout() {
        const top = screen.getBoundingClientRect().top + window.scrollY;
        screen.style.height = `${Math.max(240, Math.floor(window.innerHeight - top - BELOW))}px`;
        fit.fit();
    }

    let layoutPending = false;
    function scheduleLayout() {
        if (!layoutPending) {
            layoutPending = true;
            window.requestAnimationFrame(() => {
                layoutPending = false;
                layout();
            });
        }
    }

    function send(payload) {
        if (socket !== null && socket.readyState === WebSocket.OPEN && !OVER.has(state)) {
            socket.send(payload);
        }
    }

    function sendBytes(bytes) {
        for (let start = 0; start < bytes.length; start += MAX_INPUT_FRAME) {
            send(bytes.subarray(start, start + MAX_INPUT_FRAME));
        }
    }

    function describeExit(message) {
        let text;
        if (message.exit_code !== null && message.exit_code !== undefined) {
            text = `exited with code ${message.exit_code}`;
        } else if (message.signal) {
            text = `ended by signal ${message.signal}`;
        } else {
            text = "ended";
        }
        if (message.error) {
            text += `: ${message.error}`;
        }
        if (typeof message.duration_s === "number") {
            text += ` (after ${message.duration_s.toFixed(1)} s)`;
        }
        return text;
    }

    function handle(message) {
        if (message.type === "opened") {
            openedText = `opened: ${(message.argv || []).join(" ")} (pid ${message.pid})`;
            setStatus("opened", openedText);
            // A layout that changed while the socket was connecting resized the screen, and
            // that resize could not be sent yet: the machine gets the screen's size now.
            send(JSON.stringify({type: "resize", cols: term.cols, rows: term.rows}));
            term.focus();
        } else if (message.type === "exit") {
            setStatus("exited", describeExit(message));
        } else if (message.type === "error" && message.code) {
            setStatus("refused", `refused (${message.code}): ${message.error}`);
        } else if (message.type === "error") {
            // About one frame (e.g. too large); the terminal goes on.
            statusLine.textContent = `${openedText || state} — the server said: ${message.error}`;
        }
    }

    function connect() {
        if (socket !== null) {
            socket.close();
        }
        term.reset();
        layout();
        const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
        const query = new URLSearchParams({cols: String(term.cols), rows: String(term.rows)});
        const ws = new WebSocket(`${scheme}//${window.location.host}${page.dataset.socketPath}?${query}`);
        ws.binaryType = "arraybuffer";
        socket = ws;
        openedText = "";
        setStatus("connecting", `connecting to ${page.dataset.agentName}…`);
        ws.addEventListener("message", (event) => {
            if (ws !== socket) {
                return;
            }
            if (typeof event.data !== "string") {
                term.write(new Uint8Array(event.data));
                return;
            }
            let message;
            try {
                message = JSON.parse(event.data);
            } catch (error) {
                return;
            }
            handle(message);
        });
        ws.addEventListener("close", (event) => {
            if (ws === socket && !OVER.has(state)) {
                const reason = event.reason ? `: ${event.reason}` : "";
                setStatus("closed", `the connection closed (code ${event.code})${reason}`);
            }
        });
    }

    term.onData((data) => sendBytes(encoder.encode(data)));
    // Some mouse reports are bytes, not UTF-8 text: each character is one byte.
    term.onBinary((data) => sendBytes(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(({cols, rows}) => send(JSON.stringify({type: "resize", cols, rows})));
    window.addEventListener("resize", scheduleLayout);
    // The page's width changes without a window resize too (the admin's navigation sidebar).
    new ResizeObserver(scheduleLayout).observe(page);
    reconnectButton.addEventListener("click", connect);
    connect();
})();
