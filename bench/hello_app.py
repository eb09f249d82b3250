"""The reference for bench/gateway.py: one FastAPI route, nothing else, under the same uvicorn
settings as the gateway. What uvicorn serves on this machine."""

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def hello() -> dict[str, str]:
    return {"status": "healthy"}
