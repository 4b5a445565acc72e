"""`toolreg up` and `toolreg registry`: the long-running processes, each started on one exit stack."""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

from discovery.broker import BrokerSupervisor, EmbeddedBroker
from discovery.registry import Registry
from discovery.store import STORE_FILE, ConfigStore, ConfigStoreService
from toolservice_base import open_transport

from . import registry as cli_registry
from .common import UpLock, settings_of, wait_for_signal
from .serving import show_registry_page, start_health


async def cmd_up(args: argparse.Namespace) -> int:
    """Broker, store, registry: each step's undo goes on the exit stack as it succeeds.

    A failure at any step (or Ctrl-C) unwinds exactly the steps before it, in
    reverse: no broker, connection or task is left behind, and the error
    reaches `run` as one line.
    """
    settings = settings_of(args)
    options = cli_registry.registry_options(args)
    started = time.perf_counter()
    up = False
    async with AsyncExitStack() as stack:
        lock = UpLock(settings.data_dir)
        stack.callback(lock.release)
        lock.acquire()
        config = ConfigStore(settings.data_dir / STORE_FILE)  # checked before anything starts: a damaged store stops us here
        stack.callback(config.close)
        health = await start_health(stack, args.metrics_port)
        if health is not None:
            health.add_check("startup", lambda: None if up else "starting")
            print(f"metrics       {health.url}/metrics (and /healthz, /readyz)")
        watched: list[asyncio.Task[Any]] = []
        if settings.pulsar_url:
            url = settings.pulsar_url
            print(f"broker        {url} (PULSAR_URL)")
        else:
            broker = EmbeddedBroker(settings.data_dir)
            url = broker.start(port=args.port, adopt=True)
            stack.callback(broker.stop)
            supervisor = BrokerSupervisor(broker)
            watched.append(await stack.enter_async_context(supervisor.running()))
            if health is not None:
                health.add_check("broker", supervisor.readiness)
            how = "adopted from a previous `toolreg up`" if broker.adopted else "embedded pulsar-lite, loopback only"
            print(f"broker        {url} ({how}; restarted if it dies; URL in {broker.url_file})")
            if broker.port_note:
                print(f"note          {broker.port_note}")
        connection = await open_transport(settings, url=url)
        stack.push_async_callback(connection.close)
        print(f"workarounds   {', '.join(connection.capabilities.enabled()) or 'none'} (for {settings.broker_kind(url)})")
        store = ConfigStoreService(connection, config, protocol=args.store_protocol)
        stack.push_async_callback(store.stop)
        await store.start()
        if health is not None:
            health.add_check("config-store", store.readiness)
        print(f"config store  {store.store.path} (version {store.store.version}; {args.store_protocol} protocol)")
        if not args.no_registry:
            registry = Registry(connection, options=options)
            stack.push_async_callback(registry.stop)
            await registry.start()
            if health is not None:
                health.add_check("registry", registry.readiness)
                print(f"page          {show_registry_page(health, registry)}")
            print(f"registry      listening on {connection.topics.tool_descriptors}")
            print(f"trust         {cli_registry.trust_line(options)}")
        up = True
        print(f"ready in {(time.perf_counter() - started) * 1000:.0f} ms; Ctrl-C to stop", flush=True)
        await wait_for_signal(*watched)
        up = False
        print("stopping", flush=True)
    return 0



async def cmd_registry(args: argparse.Namespace) -> int:
    """Run the registry until SIGTERM/SIGINT."""
    options = cli_registry.registry_options(args)
    async with AsyncExitStack() as stack:
        connection = await open_transport(settings_of(args))
        stack.push_async_callback(connection.close)
        registry = Registry(connection, options=options)
        stack.push_async_callback(registry.stop)
        await registry.start()
        health = await start_health(stack, args.metrics_port)
        if health is not None:
            health.add_check("registry", registry.readiness)
            print(f"metrics on {health.url}/metrics (and /healthz, /readyz)", flush=True)
            print(f"page: {show_registry_page(health, registry)}", flush=True)
        topics = connection.topics
        print(f"registry listening on {topics.tool_descriptors}; queries on {topics.registry_request}", flush=True)
        print(f"trust: {cli_registry.trust_line(options)}", flush=True)
        await wait_for_signal()
    return 0


